package rl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func envYAML(agent, args string) string {
	return "- agent_type: " + agent + "\n  agent_args:\n" + args + "  weight: 1.0\n"
}

func TestLoadEnv(t *testing.T) {
	dir := t.TempDir()
	data := writeFile(t, filepath.Join(dir, "countdown.jsonl"), `{"target": 24, "nums": [3, 8, 1, 9]}`+"\n\n"+`{"nums": [44, 19, 35], "target": 98}`+"\n")
	cfg := writeFile(t, filepath.Join(dir, "env.yaml"), envYAML("CountdownAgent", "    dataset_file: \""+data+"\"\n    split: \"train\"\n"))
	env, err := LoadEnv(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(env.Tasks) != 2 || env.Tasks[1].Target != 98 || env.Tasks[1].Nums[2] != 35 || env.Note == "" {
		t.Fatalf("loaded %+v", env)
	}
	// A directory with <split>.jsonl.
	writeFile(t, filepath.Join(dir, "splits", "train.jsonl"), `{"target": 1, "nums": [1]}`+"\n")
	if env, err := LoadEnv(writeFile(t, filepath.Join(dir, "dir.yaml"), envYAML("CountdownAgent", "    dataset_file: "+filepath.Join(dir, "splits")+"\n"))); err != nil || len(env.Tasks) != 1 {
		t.Fatalf("directory of splits: %v, %+v", err, env)
	}

	arrow := filepath.Join(dir, "Jiayi-Pan___countdown-tasks-3to4")
	writeFile(t, filepath.Join(arrow, "dataset_info.json"), "{}")
	cache := filepath.Join(dir, "cache")
	writeFile(t, filepath.Join(cache, "countdown-train.arrow"), "x")
	writeFile(t, filepath.Join(dir, "empty.jsonl"), "\n\n")
	writeFile(t, filepath.Join(dir, "extra.jsonl"), `{"target": 24, "nums": [3, 8], "problem_id": 7}`+"\n")
	writeFile(t, filepath.Join(dir, "float.jsonl"), `{"target": 24.5, "nums": [3, 8]}`+"\n")
	writeFile(t, filepath.Join(dir, "bad.jsonl"), `{"target": 24, "nums": [3, 8]}`+"\n{oops\n")
	for _, c := range []struct{ name, yaml, want string }{
		{"no file", "", "needs --langrl-env-config"},
		{"missing", filepath.Join(dir, "nope.yaml"), "no such file"},
		{"empty config", writeFile(t, filepath.Join(dir, "e.yaml"), ""), "is empty"},
		{"not a list", writeFile(t, filepath.Join(dir, "m.yaml"), "agent_type: CountdownAgent\n"), "want a YAML list"},
		{"unknown agent", writeFile(t, filepath.Join(dir, "u.yaml"), envYAML("ChessAgent", "    dataset_file: x\n")), `unknown agent_type "ChessAgent"; Megatron's registered agent types are AIMEAgent`},
		{"megatron agent", writeFile(t, filepath.Join(dir, "g.yaml"), envYAML("GSM8KAgent", "    dataset_file: x\n")), "agent_type GSM8KAgent: needs that Megatron environment"},
		{"two envs", writeFile(t, filepath.Join(dir, "two.yaml"), envYAML("CountdownAgent", "    dataset_file: x\n")+envYAML("CountdownAgent", "    dataset_file: y\n")), "weighted multi-task"},
		{"hf name", writeFile(t, filepath.Join(dir, "hf.yaml"), envYAML("CountdownAgent", "    hf_dataset_name: \"Jiayi-Pan/Countdown-Tasks-3to4\"\n")), "does not download datasets"},
		{"arrow dir", writeFile(t, filepath.Join(dir, "a.yaml"), envYAML("CountdownAgent", "    dataset_file: "+arrow+"\n")), "Arrow directory (it has dataset_info.json): gotron reads JSON Lines; convert it"},
		{"arrow cache", writeFile(t, filepath.Join(dir, "c.yaml"), envYAML("CountdownAgent", "    dataset_file: "+cache+"\n")), "holds Arrow files (countdown-train.arrow)"},
		{"parquet", writeFile(t, filepath.Join(dir, "p.yaml"), envYAML("CountdownAgent", "    dataset_file: "+writeFile(t, filepath.Join(dir, "t.parquet"), "x")+"\n")), "is .parquet: gotron reads JSON Lines"},
		{"empty dataset", writeFile(t, filepath.Join(dir, "ed.yaml"), envYAML("CountdownAgent", "    dataset_file: "+filepath.Join(dir, "empty.jsonl")+"\n")), "has no tasks"},
		{"extra field", writeFile(t, filepath.Join(dir, "x.yaml"), envYAML("CountdownAgent", "    dataset_file: "+filepath.Join(dir, "extra.jsonl")+"\n")), `extra.jsonl:1: want {"target": int`},
		{"float target", writeFile(t, filepath.Join(dir, "f.yaml"), envYAML("CountdownAgent", "    dataset_file: "+filepath.Join(dir, "float.jsonl")+"\n")), "target 24.5: want an integer"},
		{"bad line", writeFile(t, filepath.Join(dir, "b.yaml"), envYAML("CountdownAgent", "    dataset_file: "+filepath.Join(dir, "bad.jsonl")+"\n")), "bad.jsonl:2:"},
		{"split of a file", writeFile(t, filepath.Join(dir, "s.yaml"), envYAML("CountdownAgent", "    dataset_file: "+data+"\n    split: test\n")), `only split is "train"`},
		{"unknown arg", writeFile(t, filepath.Join(dir, "k.yaml"), envYAML("CountdownAgent", "    dataset_file: "+data+"\n    shuffle: yes\n")), "no agent_args.shuffle"},
		{"no dataset", writeFile(t, filepath.Join(dir, "n.yaml"), envYAML("CountdownAgent", "    split: train\n")), "needs agent_args.dataset_file"},
	} {
		_, err := LoadEnv(c.yaml)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}
