package pp

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata goldens")

// goldenHeader starts every golden file: a magic line with a version, bumped
// when the format changes.
const goldenHeader = "gotron pp schedule golden v1\n"

// goldenCases are the configurations whose full action lists are kept in
// testdata/<name>.txt and reviewed by hand against Megatron's
// megatron/core/pipeline_parallel/schedules.py.
var goldenCases = []struct {
	name string
	cfg  Config
}{
	{"nopipe_m3", Config{Microbatches: 3}},
	{"1f1b_pp2_m1", Config{PP: 2, Microbatches: 1}},
	{"1f1b_pp2_m3", Config{PP: 2, Microbatches: 3}},
	{"1f1b_pp2_m8", Config{PP: 2, Microbatches: 8}},
	{"1f1b_pp4_m1", Config{PP: 4, Microbatches: 1}},
	{"1f1b_pp4_m3", Config{PP: 4, Microbatches: 3}},
	{"1f1b_pp4_m8", Config{PP: 4, Microbatches: 8}},
	{"interleaved_pp2_vpp2_m4", Config{PP: 2, VPP: 2, Microbatches: 4}},
	{"interleaved_pp2_vpp2_m5_g3", Config{PP: 2, VPP: 2, Microbatches: 5, GroupSize: 3}},
	{"interleaved_pp2_vpp2_m6", Config{PP: 2, VPP: 2, Microbatches: 6}},
	{"interleaved_pp3_vpp2_m6", Config{PP: 3, VPP: 2, Microbatches: 6}},
	{"interleaved_pp4_vpp2_m4", Config{PP: 4, VPP: 2, Microbatches: 4}},
	{"interleaved_pp4_vpp2_m8_g4", Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 4}},
	{"interleaved_pp4_vpp2_m8_g8", Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 8}},
}

// TestGoldenSchedules compares every rank's list with testdata; run
// "go test ./parallel/pp -run Golden -update" to rewrite them after a
// reviewed change.
func TestGoldenSchedules(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.name, func(t *testing.T) {
			got, err := renderGolden(gc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", gc.name+".txt")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if !bytes.HasPrefix(want, []byte(goldenHeader)) {
				t.Fatalf("%s: first line is not %q: regenerate with -update", path, strings.TrimSpace(goldenHeader))
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs (go test -update to accept):\n%s", path, firstDiff(got, want))
			}
		})
	}
}

// renderGolden writes cfg's schedule: flags, table, each rank's counts, its
// forward/backward order, its full action list, and the timeline.
func renderGolden(cfg Config) ([]byte, error) {
	lists, err := Schedule(cfg)
	if err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	var b bytes.Buffer
	b.WriteString(goldenHeader)
	fmt.Fprintf(&b, "flags: %s %d %s %d %s %d", flagPP, c.PP, flagVPP, c.VPP, flagM, c.Microbatches)
	if c.Kind() == Interleaved {
		fmt.Fprintf(&b, " %s %d", flagG, c.GroupSize)
	}
	fmt.Fprintf(&b, "\nschedule: %v\n", c.Kind())
	if c.Kind() == Interleaved {
		tab, _ := Table(cfg)
		b.WriteString("table (k: chunk/micro-batch):")
		for k, s := range tab {
			fmt.Fprintf(&b, " %d:%d/%d", k, s.Chunk, s.Microbatch)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "bubble (PP-1)/(VPP*M): %d/%d\n", c.PP-1, c.VPP*c.Microbatches)
	for r, list := range lists {
		ph, _ := RankPhases(cfg, r)
		fl, _ := MaxInFlight(cfg, r)
		fmt.Fprintf(&b, "\nrank %d: warmup %d, steady %d, cooldown %d, max in flight %d\n",
			r, ph.Warmup, ph.Steady, ph.Cooldown, fl)
		b.WriteString("order:")
		for _, a := range list {
			if a.Op.Compute() {
				fmt.Fprintf(&b, " %v%d", a.Op, a.Microbatch)
				if c.VPP > 1 {
					fmt.Fprintf(&b, "c%d", a.Chunk)
				}
			}
		}
		b.WriteString("\n")
		for i, a := range list {
			fmt.Fprintf(&b, "  %3d %v\n", i, a)
		}
	}
	b.WriteString("\n")
	if err := WriteTimeline(&b, cfg, 1, 2); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// firstDiff shows the first differing line of two texts.
func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n got %q\nwant %q", i+1, gl, wl)
		}
	}
	return "(same lines)"
}
