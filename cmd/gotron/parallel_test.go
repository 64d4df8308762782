package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

func runGotronLocal(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	code = run(context.Background(), env, args)
	return code, out.String(), errb.String()
}

// TestParallelGroupsWorkedExample prints the layout Megatron's RankGenerator
// (megatron/core/parallel_state.py) builds for TP=2, PP=2 on 8 ranks.
func TestParallelGroupsWorkedExample(t *testing.T) {
	code, out, errs := runGotronLocal(t, "parallel", "groups", "--world-size", "8",
		"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `{"tp":[[0,1],[2,3],[4,5],[6,7]],"pp":[[0,4],[1,5],[2,6],[3,7]],"dp":[[0,2],[1,3],[4,6],[5,7]],` +
		`"cp":[[0],[1],[2],[3],[4],[5],[6],[7]],"dp-cp":[[0,2],[1,3],[4,6],[5,7]],"tp-pp":[[0,1,4,5],[2,3,6,7]],` +
		`"tp-dp":[[0,1,2,3],[4,5,6,7]],"tp-dp-cp":[[0,1,2,3],[4,5,6,7]],"tp-cp":[[0,1],[2,3],[4,5],[6,7]],` +
		`"ep":[[0],[1],[2],[3],[4],[5],[6],[7]],"expert-tp":[[0,1],[2,3],[4,5],[6,7]],"expert-dp":[[0,2],[1,3],[4,6],[5,7]],` +
		`"tp-ep":[[0,1],[2,3],[4,5],[6,7]],"tp-ep-pp":[[0,1,4,5],[2,3,6,7]],"embedding":[[0,4],[1,5],[2,6],[3,7]],` +
		`"position-embedding":[[0],[1],[2],[3]]}` + "\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}

// TestParallelGroupsGolden runs every flag against Megatron's own output for
// a layout with CP, EP, expert TP ≠ TP and a non-default order.
func TestParallelGroupsGolden(t *testing.T) {
	raw, err := os.ReadFile("../../parallel/testdata/megatron_groups.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden []struct {
		Config map[string]any     `json:"config"`
		Groups map[string][][]int `json:"groups"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		find string // order in the golden file's config
		args []string
	}{
		{"dp-pp-cp-ep-tp", []string{"--world-size", "24", "--tensor-model-parallel-size", "2", "--context-parallel-size", "3",
			"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "3", "--expert-tensor-parallel-size", "2",
			"--order", "dp-pp-cp-ep-tp"}},
		{"tp-ep-pp-dp", []string{"--world-size=16", "--tensor-model-parallel-size=2", "--pipeline-model-parallel-size=2",
			"--expert-model-parallel-size=2", "--expert-tensor-parallel-size=1", "--order=tp-ep-pp-dp",
			"--virtual-pipeline-model-parallel-size=2"}},
	} {
		var want map[string][][]int
		for _, g := range golden {
			if g.Config["order"] == c.find {
				want = g.Groups
			}
		}
		if want == nil {
			t.Fatalf("no golden with order %s", c.find)
		}
		code, out, errs := runGotronLocal(t, append([]string{"parallel", "groups"}, c.args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errs)
		}
		var got map[string][][]int
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v: output is not JSON: %v\n%s", c.args, err, out)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v:\n got %v\nwant %v", c.args, got, want)
		}
	}
}

func TestParallelGroupsErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"parallel", "groups", "--world-size", "12", "--tensor-model-parallel-size", "8"}, 1, "world size 12 is not divisible by TP·CP·PP"},
		{[]string{"parallel", "groups"}, 1, "--world-size 0"},
		{[]string{"parallel", "groups", "--world-size", "8", "--tensor-model-paralel-size", "2"}, 1, "did you mean --tensor-model-parallel-size"},
		{[]string{"parallel", "groups", "--world-size", "8", "extra"}, 1, `unexpected argument "extra"`},
		{[]string{"parallel", "groupz"}, 1, `unknown subcommand "groupz"`},
		{[]string{"parallel"}, 1, "missing subcommand"},
		{[]string{"parallel", "groups", "--world-size", "8", "--order", "tp-dp-qq"}, 1, `unknown axis "qq"`},
		{[]string{"parallel", "groups", "--help"}, 0, ""},
	} {
		code, _, errs := runGotronLocal(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.want)
		}
	}
}

func TestParallelGroupsRankAndMapping(t *testing.T) {
	code, out, errs := runGotronLocal(t, "parallel", "groups", "--world-size", "8", "--tensor-model-parallel-size", "2",
		"--pipeline-model-parallel-size", "2", "--rank", "5")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `{"rank":5,"coords":{"cp":0,"dp":0,"ep":0,"expert-dp":0,"expert-tp":1,"first-stage":false,"last-stage":true,"pp":1,"tp":1},` +
		`"groups":{"tp":[4,5],"pp":[1,5],"dp":[5,7],"cp":[5],"dp-cp":[5,7],"tp-pp":[0,1,4,5],"tp-dp":[4,5,6,7],` +
		`"tp-dp-cp":[4,5,6,7],"tp-cp":[4,5],"ep":[5],"expert-tp":[4,5],"expert-dp":[5,7],"tp-ep":[4,5],"tp-ep-pp":[0,1,4,5],` +
		`"embedding":[1,5],"position-embedding":null}}` + "\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	// Megatron's --use-tp-pp-dp-mapping is the order tp-cp-ep-pp-dp.
	_, a, _ := runGotronLocal(t, "parallel", "groups", "--world-size", "8", "--pipeline-model-parallel-size", "2", "--use-tp-pp-dp-mapping")
	_, b, _ := runGotronLocal(t, "parallel", "groups", "--world-size", "8", "--pipeline-model-parallel-size", "2", "--order", "tp-cp-ep-pp-dp")
	if a != b || !strings.Contains(a, `"pp":[[0,1],[2,3],[4,5],[6,7]]`) {
		t.Errorf("--use-tp-pp-dp-mapping:\n%s\nwant\n%s", a, b)
	}
	// --num-distributed-optimizer-instances adds Megatron's instance groups
	// (parallel/testdata/distopt_instance_groups.json, its first case).
	_, a, _ = runGotronLocal(t, "parallel", "groups", "--world-size", "8", "--tensor-model-parallel-size", "2", "--num-distributed-optimizer-instances", "2")
	if !strings.HasSuffix(a, `,"dist-opt-instance":[[0,2],[1,3],[4,6],[5,7]],"dist-opt-inter":[[0,4],[1,5],[2,6],[3,7]],"expert-dist-opt-instance":[[0,2],[1,3],[4,6],[5,7]]}`+"\n") {
		t.Errorf("--num-distributed-optimizer-instances 2:\n%s", a)
	}
	_, a, _ = runGotronLocal(t, "parallel", "groups", "--world-size", "8", "--tensor-model-parallel-size", "2", "--num-distributed-optimizer-instances", "2", "--rank", "5")
	if !strings.Contains(a, `"dist-opt-instance":[5,7],"dist-opt-inter":[1,5],"expert-dist-opt-instance":[5,7]}`) {
		t.Errorf("--num-distributed-optimizer-instances 2 --rank 5:\n%s", a)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--world-size", "8", "--rank", "8"}, "--rank 8: want 0..7"},
		{[]string{"--world-size", "8", "--num-distributed-optimizer-instances", "3"}, "must divide by 3 distributed-optimizer instances"},
		{[]string{"--world-size", "8", "--use-tp-pp-dp-mapping", "--order", "pp-dp"}, "conflicts with --order pp-dp"},
	} {
		code, _, errs := runGotronLocal(t, append([]string{"parallel", "groups"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}
