package rl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// EnvConfig is one entry of Megatron's --langrl-env-config YAML file (a list
// of agents with weights, megatron/rl/agent/weighted_multi_task.py).
type EnvConfig struct {
	AgentType string         `yaml:"agent_type"`
	AgentArgs map[string]any `yaml:"agent_args"`
	Weight    *float64       `yaml:"weight"`
}

// Megatron's agent registry (megatron/rl/agent/registry.py): gotron builds
// CountdownAgent; the others are named so a config that uses one gets a
// refusal rather than "unknown".
var megatronAgents = []string{"AIMEAgent", "AceMathAgent", "BigMathAgent", "CountdownAgent", "DAPOAgent",
	"GSM8KAgent", "NemoGymAgent", "OpenMathInstructAgent", "RemoteAgent"}

// Countdown's split sizes (CountdownAgent.get_dataset).
const (
	countdownTrainSize = 327680
	countdownTestSize  = 1024
)

// Env is a loaded environment: the tasks prompts are drawn from.
type Env struct {
	// Tasks are the training tasks (CountdownAgent.get_dataset's train split).
	Tasks []Countdown
	// Source names where they came from, for the log.
	Source string
	// Note says how the split was chosen (empty when as Megatron's).
	Note string
}

// LoadEnv reads the --langrl-env-config file at path and the dataset its
// agent names. Relative dataset paths are relative to the working
// directory, as in Megatron.
func LoadEnv(path string) (*Env, error) {
	if path == "" {
		return nil, errors.New("rl: --perform-rl-step needs --langrl-env-config (a YAML list of environments, e.g. examples/rl/environment_configs/countdown.yaml)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rl: --langrl-env-config: %w", err)
	}
	var envs []EnvConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&envs); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("rl: --langrl-env-config %s is empty: want a YAML list of {agent_type, agent_args, weight}", path)
		}
		return nil, fmt.Errorf("rl: --langrl-env-config %s: want a YAML list of {agent_type, agent_args, weight}: %w", path, err)
	}
	switch {
	case len(envs) == 0:
		return nil, fmt.Errorf("rl: --langrl-env-config %s lists no environment", path)
	case len(envs) > 1:
		return nil, fmt.Errorf("rl: --langrl-env-config %s lists %d environments: needs Megatron's weighted multi-task agent, not built in gotron (give one)", path, len(envs))
	}
	e := envs[0]
	if e.Weight != nil && *e.Weight <= 0 {
		return nil, fmt.Errorf("rl: --langrl-env-config %s: weight %g: want > 0", path, *e.Weight)
	}
	switch e.AgentType {
	case "CountdownAgent":
	case "":
		return nil, fmt.Errorf("rl: --langrl-env-config %s: the environment has no agent_type (want CountdownAgent)", path)
	default:
		for _, a := range megatronAgents {
			if a == e.AgentType {
				return nil, fmt.Errorf("rl: --langrl-env-config %s: agent_type %s: needs that Megatron environment, not built in gotron (CountdownAgent is)", path, e.AgentType)
			}
		}
		return nil, fmt.Errorf("rl: --langrl-env-config %s: unknown agent_type %q; Megatron's registered agent types are %s (gotron builds CountdownAgent)", path, e.AgentType, strings.Join(megatronAgents, ", "))
	}
	split := "train"
	var file, hfName string
	for k, v := range e.AgentArgs {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("rl: --langrl-env-config %s: agent_args.%s is %v: want a string", path, k, v)
		}
		switch k {
		case "dataset_file":
			file = s
		case "hf_dataset_name":
			hfName = s
		case "split":
			split = s
		default:
			return nil, fmt.Errorf("rl: --langrl-env-config %s: CountdownAgent has no agent_args.%s (it takes dataset_file, hf_dataset_name, split)", path, k)
		}
	}
	if file == "" {
		if hfName != "" {
			return nil, fmt.Errorf("rl: --langrl-env-config %s: hf_dataset_name %q: gotron does not download datasets; export the split to JSON Lines (python3 -c 'import datasets; datasets.load_dataset(%q, split=%q).to_json(\"countdown.jsonl\")') and set dataset_file", path, hfName, hfName, split)
		}
		return nil, fmt.Errorf("rl: --langrl-env-config %s: CountdownAgent needs agent_args.dataset_file (a JSON Lines file of {\"target\": ..., \"nums\": [...]})", path)
	}
	tasks, src, err := loadCountdown(file, split)
	if err != nil {
		return nil, fmt.Errorf("rl: --langrl-env-config %s: %w", path, err)
	}
	env := &Env{Source: src}
	// CountdownAgent.get_dataset trains on the first 327,680 tasks and
	// keeps the next 1,024 for validation, asserting more than both.
	if len(tasks) > countdownTrainSize+countdownTestSize {
		env.Tasks = tasks[:countdownTrainSize]
	} else {
		env.Tasks = tasks
		env.Note = fmt.Sprintf("%d tasks, not more than Megatron's %d training + %d validation (where its CountdownAgent stops): training on all of them", len(tasks), countdownTrainSize, countdownTestSize)
	}
	return env, nil
}

// loadCountdown reads the countdown tasks of dataset_file's split: a JSON
// Lines file (HF's single-file datasets have only the "train" split), or a
// directory holding <split>.jsonl. Hugging Face's Arrow directories
// (save_to_disk, the datasets cache) and Parquet are refused with the
// command that converts them.
func loadCountdown(file, split string) ([]Countdown, string, error) {
	convert := fmt.Sprintf("convert it: python3 -c 'import datasets; datasets.load_from_disk(\"DIR\")[%q].to_json(\"%s.jsonl\")' (or load_dataset(\"arrow\", data_dir=\"DIR\", split=%q) for a cache directory)", split, split, split)
	st, err := os.Stat(file)
	if err != nil {
		return nil, "", fmt.Errorf("dataset_file: %w", err)
	}
	if st.IsDir() {
		for _, marker := range []string{"dataset_info.json", "state.json", "dataset_dict.json"} {
			if _, err := os.Stat(filepath.Join(file, marker)); err == nil {
				return nil, "", fmt.Errorf("dataset_file %s is a Hugging Face datasets Arrow directory (it has %s): gotron reads JSON Lines; %s", file, marker, strings.ReplaceAll(convert, "DIR", file))
			}
		}
		if m, _ := filepath.Glob(filepath.Join(file, "*.arrow")); len(m) > 0 {
			return nil, "", fmt.Errorf("dataset_file %s holds Arrow files (%s): gotron reads JSON Lines; %s", file, filepath.Base(m[0]), strings.ReplaceAll(convert, "DIR", file))
		}
		p := filepath.Join(file, split+".jsonl")
		if _, err := os.Stat(p); err != nil {
			return nil, "", fmt.Errorf("dataset_file %s is a directory without %s.jsonl (split %q): want a JSON Lines file, or a directory with one per split", file, split, split)
		}
		file = p
	} else {
		switch strings.ToLower(filepath.Ext(file)) {
		case ".arrow", ".parquet":
			return nil, "", fmt.Errorf("dataset_file %s is %s: gotron reads JSON Lines; %s", file, filepath.Ext(file),
				"convert it: python3 -c 'import datasets; datasets.Dataset.from_file(\"F\").to_json(\"countdown.jsonl\")' (from_parquet for Parquet)")
		}
		if split != "train" {
			return nil, "", fmt.Errorf("dataset_file %s is one file, whose only split is \"train\" (as Hugging Face loads a single file), not %q: give a directory with %s.jsonl", file, split, split)
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, "", fmt.Errorf("dataset_file: %w", err)
	}
	defer f.Close()
	var tasks []Countdown
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		task, err := parseCountdown(b)
		if err != nil {
			return nil, "", fmt.Errorf("%s:%d: %w", file, line, err)
		}
		tasks = append(tasks, task)
	}
	if err := sc.Err(); err != nil {
		return nil, "", fmt.Errorf("%s: line %d: %w", file, line+1, err)
	}
	if len(tasks) == 0 {
		return nil, "", fmt.Errorf("%s has no tasks: want one JSON object per line, {\"target\": 24, \"nums\": [3, 8, 1, 9]}", file)
	}
	return tasks, file, nil
}

// parseCountdown reads one task: exactly the fields target and nums
// (CountdownAgent.make_prefix(**task) takes no others), integers.
func parseCountdown(b []byte) (Countdown, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var raw struct {
		Target *json.Number  `json:"target"`
		Nums   []json.Number `json:"nums"`
	}
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Countdown{}, fmt.Errorf("want {\"target\": int, \"nums\": [int, ...]} (Megatron's CountdownAgent passes the row to make_prefix(target, nums), so no other fields): %v", err)
	}
	if dec.More() {
		return Countdown{}, errors.New("more than one JSON value on the line")
	}
	if raw.Target == nil || raw.Nums == nil {
		return Countdown{}, errors.New("want both \"target\" and \"nums\"")
	}
	var c Countdown
	var err error
	if c.Target, err = raw.Target.Int64(); err != nil {
		return Countdown{}, fmt.Errorf("target %s: want an integer", raw.Target.String())
	}
	if len(raw.Nums) == 0 {
		return Countdown{}, errors.New("nums is empty")
	}
	for _, n := range raw.Nums {
		v, err := n.Int64()
		if err != nil || v < 0 {
			return Countdown{}, fmt.Errorf("nums has %s: want non-negative integers (the answer's numbers are read as digit runs)", n.String())
		}
		c.Nums = append(c.Nums, v)
	}
	return c, nil
}
