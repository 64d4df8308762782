package parallel

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestWorkedExample checks the groups Megatron's RankGenerator
// (megatron/core/parallel_state.py) builds for tp-cp-ep-dp-pp, TP=2, DP=2,
// PP=2, 8 ranks; expert ETP=1, EP=2.
func TestWorkedExample(t *testing.T) {
	l, err := NewLayout(Config{WorldSize: 8, TP: 2, PP: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[Kind][][]int{
		TP:                {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
		DP:                {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
		PP:                {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
		TPPP:              {{0, 1, 4, 5}, {2, 3, 6, 7}},
		TPDP:              {{0, 1, 2, 3}, {4, 5, 6, 7}},
		DPCP:              {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
		CP:                {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
		TPCP:              {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
		TPEP:              {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
		TPEPPP:            {{0, 1, 4, 5}, {2, 3, 6, 7}},
		Embedding:         {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
		PositionEmbedding: {{0}, {1}, {2}, {3}},
	}
	for k, w := range want {
		if got := l.Groups(k); !reflect.DeepEqual(got, w) {
			t.Errorf("%s: got %v, want %v", k, got, w)
		}
	}
	e, err := NewLayout(Config{WorldSize: 8, TP: 2, PP: 2, EP: 2, ETP: 1})
	if err != nil {
		t.Fatal(err)
	}
	if e.ExpertDP != 2 {
		t.Errorf("expert DP = %d, want 2", e.ExpertDP)
	}
	for k, w := range map[Kind][][]int{
		EP:       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
		ExpertDP: {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
		ExpertTP: {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
	} {
		if got := e.Groups(k); !reflect.DeepEqual(got, w) {
			t.Errorf("expert %s: got %v, want %v", k, got, w)
		}
	}
}

// goldenCase is one record of testdata/megatron_groups.json, written by
// testdata/gen_golden.py from Megatron-LM's own parallel_state.py.
type goldenCase struct {
	Config struct {
		World, TP, PP, CP, EP, VPP int
		ETP                        *int
		Order                      string
	} `json:"config"`
	Groups map[Kind][][]int `json:"groups"`
	Error  string           `json:"error"`
}

// TestMegatronGolden compares every group against Megatron's RankGenerator
// output, and every rejection against Megatron's.
func TestMegatronGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/megatron_groups.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatalf("testdata/megatron_groups.json: %v", err)
	}
	if len(cases) < 20 {
		t.Fatalf("only %d golden cases", len(cases))
	}
	for _, c := range cases {
		cfg := Config{WorldSize: c.Config.World, TP: c.Config.TP, PP: c.Config.PP, CP: c.Config.CP,
			EP: c.Config.EP, VPP: c.Config.VPP, Order: c.Config.Order}
		if c.Config.ETP != nil {
			cfg.ETP = *c.Config.ETP
		}
		l, err := NewLayout(cfg)
		if c.Error != "" {
			if err == nil {
				t.Errorf("%+v: Megatron raises %s, NewLayout accepted it", cfg, c.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", cfg, err)
			continue
		}
		if len(c.Groups) != len(Kinds()) {
			t.Errorf("%+v: golden has %d kinds, want %d", cfg, len(c.Groups), len(Kinds()))
		}
		for _, k := range Kinds() {
			if got := l.Groups(k); !reflect.DeepEqual(got, c.Groups[k]) {
				t.Errorf("%+v %s:\n got %v\nwant %v", cfg, k, got, c.Groups[k])
			}
		}
	}
}

// legacyGroups is Megatron's construction from before RankGenerator (the
// nested loops of its old initialize_model_parallel, kept in its unit test as
// the golden): order tp-cp-dp-pp for the decoder and tp-ep-dp-pp for experts
// with ETP = TP. Written independently here as a second oracle.
func legacyGroups(world, tp, pp, cp, ep int) map[Kind][][]int {
	dp := world / (tp * pp * cp)
	perStage := world / pp // ranks in one pipeline stage
	g := map[Kind][][]int{}
	var dpcp [][]int
	for s := range pp {
		start := s * perStage
		for j := range cp * tp {
			g[DP] = append(g[DP], stepRange(start+j, start+perStage, cp*tp))
		}
		for j := range tp {
			dpcp = append(dpcp, stepRange(start+j, start+perStage, tp))
		}
	}
	g[DPCP] = dpcp
	for s := range pp {
		for j := range dp {
			start := s*perStage + j*tp*cp
			for k := range tp {
				g[CP] = append(g[CP], stepRange(start+k, start+tp*cp, tp))
			}
		}
	}
	for i := range dp * cp {
		var mp []int
		for _, d := range dpcp {
			mp = append(mp, d[i])
		}
		g[TPPP] = append(g[TPPP], mp)
	}
	for i := range world / tp {
		g[TP] = append(g[TP], stepRange(i*tp, (i+1)*tp, 1))
	}
	for i := range perStage {
		g[PP] = append(g[PP], stepRange(i, world, perStage))
	}
	block := tp * dp * cp
	for i := range world / block {
		g[TPDPCP] = append(g[TPDPCP], stepRange(i*block, (i+1)*block, 1))
		for j := range cp {
			var r []int
			for k := range dp {
				start := i*block + j*tp + k*tp*cp
				r = append(r, stepRange(start, start+tp, 1)...)
			}
			g[TPDP] = append(g[TPDP], r)
		}
	}
	// Experts: ranks as an array of shape (pp, edp, ep, tp), row-major.
	edp := world / (tp * pp * ep)
	for i := range pp * edp {
		g[TPEP] = append(g[TPEP], stepRange(i*ep*tp, (i+1)*ep*tp, 1))
	}
	for s := range pp {
		for e := range ep {
			for t := range tp {
				var r []int
				for d := range edp {
					r = append(r, ((s*edp+d)*ep+e)*tp+t)
				}
				g[ExpertDP] = append(g[ExpertDP], r)
			}
		}
	}
	return g
}

func stepRange(start, end, step int) []int {
	var r []int
	for i := start; i < end; i += step {
		r = append(r, i)
	}
	return r
}

// megatronConfigs are the 35 (nodes, gpus per node, tp, pp, cp, ep) of
// Megatron's test_rank_generator_for_tp_dp_pp.
var megatronConfigs = [][6]int{
	{1, 1, 1, 1, 1, 1}, {1, 8, 8, 1, 1, 1}, {1, 8, 2, 2, 1, 1}, {1, 8, 2, 4, 1, 1},
	{3, 8, 8, 3, 1, 1}, {4, 8, 2, 4, 1, 1}, {8, 8, 8, 8, 1, 1}, {8, 8, 2, 1, 1, 4},
	{8, 8, 2, 2, 2, 4}, {8, 8, 2, 1, 4, 8}, {8, 8, 2, 2, 2, 8}, {16, 8, 4, 8, 1, 1},
	{16, 8, 4, 8, 1, 4}, {16, 8, 4, 8, 4, 1}, {16, 8, 8, 8, 1, 1}, {16, 8, 4, 8, 1, 1},
	{16, 8, 8, 8, 1, 1}, {32, 8, 4, 8, 1, 1}, {32, 8, 8, 8, 1, 1}, {32, 8, 4, 8, 1, 4},
	{32, 8, 8, 8, 4, 1}, {64, 8, 4, 2, 8, 8}, {64, 8, 4, 8, 1, 1}, {64, 8, 8, 8, 1, 1},
	{96, 8, 4, 8, 1, 1}, {128, 8, 4, 2, 8, 8}, {128, 8, 4, 8, 1, 1}, {256, 8, 4, 8, 1, 1},
	{316, 8, 4, 8, 1, 1}, {384, 8, 4, 8, 1, 1}, {512, 8, 4, 8, 1, 1}, {768, 8, 4, 8, 1, 1},
	{1024, 8, 4, 8, 1, 1}, {1280, 8, 4, 8, 1, 1}, {1344, 8, 4, 8, 1, 1},
}

// TestLegacyConstruction is Megatron's acceptance test: its 35 layouts (up to
// 10,752 ranks) plus every small layout, compared with the pre-RankGenerator
// construction for both orders it covers.
func TestLegacyConstruction(t *testing.T) {
	type cfg struct{ world, tp, pp, cp, ep int }
	var cfgs []cfg
	for _, m := range megatronConfigs {
		cfgs = append(cfgs, cfg{m[0] * m[1], m[2], m[3], m[4], m[5]})
	}
	for world := 1; world <= 48; world++ {
		for tp := 1; tp <= world; tp++ {
			for pp := 1; tp*pp <= world; pp++ {
				for cp := 1; tp*pp*cp <= world; cp++ {
					for ep := 1; tp*pp*ep <= world; ep++ {
						if world%(tp*pp*cp) == 0 && world%(tp*pp*ep) == 0 {
							cfgs = append(cfgs, cfg{world, tp, pp, cp, ep})
						}
					}
				}
			}
		}
	}
	for _, c := range cfgs {
		l, err := NewLayout(Config{WorldSize: c.world, TP: c.tp, PP: c.pp, CP: c.cp, EP: c.ep})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		for k, want := range legacyGroups(c.world, c.tp, c.pp, c.cp, c.ep) {
			if got := l.groups[k]; !reflect.DeepEqual(got, want) {
				t.Fatalf("%+v %s: RankGenerator and legacy construction differ:\n got %v\nwant %v", c, k, got, want)
			}
		}
	}
	t.Logf("%d layouts agree", len(cfgs))
}

// TestPartition checks invariants every layout must satisfy: each kind's
// groups partition the ranks (embedding kinds excepted), GroupOf agrees with
// Groups, and Coords are each rank's index in its groups.
func TestPartition(t *testing.T) {
	for _, cfg := range []Config{
		{WorldSize: 16, TP: 2, CP: 2, PP: 2, EP: 2, ETP: 1},
		{WorldSize: 24, TP: 2, CP: 3, PP: 2, EP: 3, ETP: 2, Order: "dp-pp-cp-ep-tp"},
		{WorldSize: 32, TP: 2, PP: 4, EP: 2, ETP: 4, VPP: 3},
		{WorldSize: 6, Order: "pp-dp"},
	} {
		l, err := NewLayout(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range Kinds() {
			seen := make([]int, cfg.WorldSize)
			for _, g := range l.Groups(k) {
				for _, r := range g {
					seen[r]++
					if got := l.GroupOf(k, r); !slices.Equal(got, g) {
						t.Errorf("%+v: GroupOf(%s, %d) = %v, want %v", cfg, k, r, got, g)
					}
				}
			}
			if k == Embedding || k == PositionEmbedding {
				continue
			}
			for r, n := range seen {
				if n != 1 {
					t.Errorf("%+v %s: rank %d in %d groups", cfg, k, r, n)
				}
			}
		}
		for r := range cfg.WorldSize {
			c, err := l.Coords(r)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []struct {
				k    Kind
				want int
			}{{TP, c.TP}, {CP, c.CP}, {DP, c.DP}, {PP, c.PP}, {ExpertTP, c.ExpertTP}, {EP, c.EP}, {ExpertDP, c.EDP}} {
				if i := slices.Index(l.GroupOf(p.k, r), r); i != p.want {
					t.Errorf("%+v rank %d: index in %s group %d, coordinate %d", cfg, r, p.k, i, p.want)
				}
			}
			pp := l.GroupOf(PP, r)
			if c.FirstStage != (pp[0] == r) || c.LastStage != (pp[len(pp)-1] == r) {
				t.Errorf("%+v rank %d: stage flags %v %v, pp group %v", cfg, r, c.FirstStage, c.LastStage, pp)
			}
		}
	}
}

// TestErrors checks that impossible layouts are rejected with a message that
// names every degree involved.
func TestErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want []string
	}{
		{Config{WorldSize: 12, TP: 8}, []string{"world size 12", "TP=8", "CP=1", "PP=1"}},
		{Config{WorldSize: 16, TP: 2, CP: 3, PP: 2}, []string{"world size 16", "TP=2", "CP=3", "PP=2"}},
		{Config{WorldSize: 8, EP: 3}, []string{"world size 8", "ETP=1", "EP=3", "PP=1"}},
		{Config{WorldSize: 16, TP: 4, ETP: 2, EP: 3}, []string{"ETP=2", "EP=3"}},
		{Config{WorldSize: 0}, []string{"WorldSize=0"}},
		{Config{WorldSize: 8, TP: -2}, []string{"TP=-2"}},
		{Config{WorldSize: 8, VPP: 2}, []string{"VPP=2", "PP=1"}},
		{Config{WorldSize: 16, TP: 2, CP: 2, Order: "tp-ep-dp-pp"}, []string{"cp", "size 2", "tp-ep-dp-pp"}},
		{Config{WorldSize: 8, TP: 2, Order: "tp-xp-dp"}, []string{`"xp"`}},
		{Config{WorldSize: 8, TP: 2, Order: "tp-dp-tp"}, []string{`"tp" appears twice`}},
		{Config{WorldSize: 16, TP: 2, PP: 2, EP: 4, ETP: 2, Order: "tp-cp-ep-pp-dp"}, []string{"DP=4", "expert DP=1"}},
		{Config{WorldSize: 16, TP: 2, CP: 2, PP: 2, EP: 4, ETP: 1, Order: "tp-pp-cp-ep-dp"}, []string{"different pipeline groups", "ETP=1", "EP=4"}},
	} {
		_, err := NewLayout(c.cfg)
		if err == nil {
			t.Errorf("%+v: no error", c.cfg)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not mention %q", c.cfg, err, w)
			}
		}
	}
}

func TestGroupOfOutside(t *testing.T) {
	l, err := NewLayout(Config{WorldSize: 8, PP: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		k    Kind
		rank int
	}{{TP, -1}, {TP, 8}, {"nope", 0}, {Embedding, 2}, {PositionEmbedding, 6}} {
		if g := l.GroupOf(c.k, c.rank); g != nil {
			t.Errorf("GroupOf(%s, %d) = %v, want nil", c.k, c.rank, g)
		}
	}
	if _, err := l.Coords(8); err == nil {
		t.Error("Coords(8) of 8 ranks: no error")
	}
	g := l.Groups(TP)
	g[0][0] = 99
	if l.Groups(TP)[0][0] != 0 {
		t.Error("Groups returned internal storage")
	}
}

// BenchmarkNewLayout builds the largest layout of Megatron's test
// (1344 nodes × 8 = 10,752 ranks, TP=4, PP=8): every group of every kind.
func BenchmarkNewLayout(b *testing.B) {
	for b.Loop() {
		if _, err := NewLayout(Config{WorldSize: 10752, TP: 4, PP: 8}); err != nil {
			b.Fatal(err)
		}
	}
}
