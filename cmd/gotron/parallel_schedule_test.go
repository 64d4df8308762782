package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gotron/gotron/parallel/pp"
)

// TestParallelScheduleJSON prints 1F1B on two ranks exactly, and checks an
// interleaved layout against package pp's lists.
func TestParallelScheduleJSON(t *testing.T) {
	code, out, errs := runGotronLocal(t, "parallel", "schedule", "--pipeline-model-parallel-size", "2", "--num-microbatches", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `{"ranks":[[["F",0,0],["F",0,1],["B",0,0],["F",0,2],["B",0,1],["B",0,2]],` +
		`[["F",0,0],["B",0,0],["F",0,1],["B",0,1],["F",0,2],["B",0,2]]]}` + "\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}

	code, out, errs = runGotronLocal(t, "parallel", "schedule", "--pipeline-model-parallel-size=4",
		"--virtual-pipeline-model-parallel-size=2", "--num-microbatches=8", "--microbatch-group-size-per-virtual-pipeline-stage=8")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Ranks [][][]any `json:"ranks"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	lists, err := pp.Schedule(pp.Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Ranks) != 4 {
		t.Fatalf("%d ranks, want 4", len(got.Ranks))
	}
	for r, list := range lists {
		i := 0
		for _, a := range list {
			if !a.Op.Compute() {
				continue
			}
			if i >= len(got.Ranks[r]) {
				t.Fatalf("rank %d: only %d passes", r, len(got.Ranks[r]))
			}
			e := got.Ranks[r][i]
			if len(e) != 3 || e[0] != a.Op.String() || e[1] != float64(a.Chunk) || e[2] != float64(a.Microbatch) {
				t.Fatalf("rank %d pass %d: %v, want %v", r, i, e, a)
			}
			i++
		}
		if i != len(got.Ranks[r]) || i != 32 {
			t.Errorf("rank %d: %d passes printed, %d in the schedule, want 32", r, len(got.Ranks[r]), i)
		}
	}
}

// TestParallelScheduleText draws the time-line (forward 1 unit, backward 2).
func TestParallelScheduleText(t *testing.T) {
	code, out, errs := runGotronLocal(t, "parallel", "schedule", "--pipeline-model-parallel-size", "2",
		"--num-microbatches", "3", "--format", "text")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `1f1b: PP=2 VPP=1 M=3; one column per time unit, forward 1, backward 2; "." idle
rank 0 | F0 F1 .  .  B0    F2 B1    .  B2
rank 1 | .  F0 B0    F1 B1    F2 B2
makespan 12 units; idle 6 of 24 rank-units, bubble 6/18 = 0.3333 of compute ((PP-1)/(VPP*M) = 0.3333)
`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	code, out, _ = runGotronLocal(t, "parallel", "schedule", "--pipeline-model-parallel-size", "2",
		"--virtual-pipeline-model-parallel-size", "2", "--num-microbatches", "4", "--format", "text")
	if code != 0 || !strings.Contains(out, "rank 0 | F0a F1a F0b F1b F2a .   B0b") {
		t.Errorf("interleaved text: exit %d\n%s", code, out)
	}
}

func TestParallelScheduleErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--pipeline-model-parallel-size", "4"}, 1, "--num-microbatches 0"},
		{[]string{"--virtual-pipeline-model-parallel-size", "2", "--num-microbatches", "4"}, 1,
			"--virtual-pipeline-model-parallel-size 2 needs --pipeline-model-parallel-size > 1"},
		{[]string{"--pipeline-model-parallel-size", "4", "--virtual-pipeline-model-parallel-size", "2", "--num-microbatches", "8",
			"--microbatch-group-size-per-virtual-pipeline-stage", "2"}, 1,
			"--microbatch-group-size-per-virtual-pipeline-stage 2 is outside [--pipeline-model-parallel-size 4, --num-microbatches 8]"},
		{[]string{"--pipeline-model-parallel-size", "4", "--virtual-pipeline-model-parallel-size", "2", "--num-microbatches", "9"}, 1,
			"leaves a last group of 1 micro-batches"},
		{[]string{"--pipeline-model-parallel-size", "-2", "--num-microbatches", "4"}, 1, "--pipeline-model-parallel-size -2: must not be negative"},
		{[]string{"--num-microbatches", "4", "--format", "yaml"}, 1, "--format yaml: want json or text"},
		{[]string{"--num-microbatches", "four"}, 1, `invalid value "four" for flag --num-microbatches`},
		{[]string{"--num-microbatche", "4"}, 1, "did you mean --num-microbatches"},
		{[]string{"--num-microbatches", "4", "extra"}, 1, `unexpected argument "extra"`},
		{[]string{"--help"}, 0, ""},
	} {
		code, out, errs := runGotronLocal(t, append([]string{"parallel", "schedule"}, c.args...)...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.want)
		}
		if c.code != 0 && out != "" {
			t.Errorf("%v: printed %q on error", c.args, out)
		}
	}
	code, out, _ := runGotronLocal(t, "parallel", "--help")
	if code != 0 || !strings.Contains(out, "gotron parallel schedule") {
		t.Errorf("parallel --help: exit %d\n%s", code, out)
	}
}
