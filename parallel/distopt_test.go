package parallel

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestDistOptInstanceGroupsGolden: the groups of
// --num-distributed-optimizer-instances are the ones Megatron's
// initialize_model_parallel builds (testdata/distopt_instance_groups.json,
// written by testdata/gen_distopt_golden.py from Megatron's code).
func TestDistOptInstanceGroupsGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/distopt_instance_groups.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Config struct {
			World, TP, PP, CP, EP, N int
			ETP                      *int
			Order                    string
		}
		Groups struct {
			Intra, Inter [][]int
			IntraExpert  [][]int `json:"intra_expert"`
		}
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 9 {
		t.Fatalf("%d golden cases, want the script's 9", len(cases))
	}
	for _, c := range cases {
		cfg := Config{WorldSize: c.Config.World, TP: c.Config.TP, PP: c.Config.PP, CP: c.Config.CP, EP: c.Config.EP,
			DistOptInstances: c.Config.N, Order: c.Config.Order}
		if c.Config.ETP != nil {
			cfg.ETP = *c.Config.ETP
		}
		l, err := NewLayout(cfg)
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		for r := range c.Config.World {
			intra, inter := l.DistOptInstanceGroups(r)
			if !slices.Equal(intra, c.Groups.Intra[r]) || !slices.Equal(inter, c.Groups.Inter[r]) {
				t.Errorf("%+v rank %d: instance %v, across instances %v; Megatron %v, %v", cfg, r, intra, inter, c.Groups.Intra[r], c.Groups.Inter[r])
			}
			if e := l.DistOptExpertInstance(r); !slices.Equal(e, c.Groups.IntraExpert[r]) {
				t.Errorf("%+v rank %d: experts' instance %v; Megatron %v", cfg, r, e, c.Groups.IntraExpert[r])
			}
		}
	}
}

// TestDistOptInstancesBadInput: instance counts Megatron refuses are
// refused, naming the sizes.
func TestDistOptInstancesBadInput(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{WorldSize: 8, TP: 2, DistOptInstances: 3}, "data × context parallel size 4 (DP=4, CP=1) and the expert-data-parallel size 4 must divide by 3"},
		{Config{WorldSize: 8, DistOptInstances: -1}, "DistOptInstances=-1"},
	} {
		if _, err := NewLayout(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
