package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gotron/gotron/parallel"
)

const parallelGroupsSynopsis = "parallel groups --world-size N [--tensor-model-parallel-size N] " +
	"[--pipeline-model-parallel-size N] [--context-parallel-size N] [--expert-model-parallel-size N] " +
	"[--expert-tensor-parallel-size N] [--virtual-pipeline-model-parallel-size N] [--order tp-cp-ep-dp-pp]"

// cmdParallel dispatches "gotron parallel <sub>".
func cmdParallel(ctx context.Context, env *cli, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("missing subcommand: want 'parallel groups' (usage: gotron %s)", parallelGroupsSynopsis)
	}
	switch args[0] {
	case "groups":
		return cmdParallelGroups(env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintf(env.stdout, "Usage: gotron %s\n", parallelGroupsSynopsis)
		return errHelp
	}
	msg := fmt.Sprintf("unknown subcommand %q: want 'parallel groups'", args[0])
	if strings.HasPrefix(args[0], "-") {
		msg = fmt.Sprintf("flag %s before the subcommand: want 'gotron parallel groups %s'", args[0], args[0])
	}
	return fmt.Errorf("%s", msg)
}

// cmdParallelGroups prints every rank group of a layout as one JSON object,
// keys in parallel.Kinds order: {"tp":[[0,1],...],"pp":[...],...}.
func cmdParallelGroups(env *cli, args []string) error {
	fs := newFlags("parallel groups", parallelGroupsSynopsis)
	var cfg parallel.Config
	fs.IntVar(&cfg.WorldSize, "world-size", 0, "number of ranks (required)")
	fs.IntVar(&cfg.TP, "tensor-model-parallel-size", 1, "tensor-parallel degree")
	fs.IntVar(&cfg.PP, "pipeline-model-parallel-size", 1, "pipeline-parallel degree")
	fs.IntVar(&cfg.CP, "context-parallel-size", 1, "context-parallel degree")
	fs.IntVar(&cfg.EP, "expert-model-parallel-size", 1, "expert-parallel degree")
	fs.IntVar(&cfg.ETP, "expert-tensor-parallel-size", 0, "expert tensor-parallel degree (0: same as --tensor-model-parallel-size)")
	fs.IntVar(&cfg.VPP, "virtual-pipeline-model-parallel-size", 0, "virtual pipeline stages per rank (0: no interleaving)")
	fs.StringVar(&cfg.Order, "order", parallel.DefaultOrder, "rank order, leftmost axis varies fastest")
	fs.String("config", "", "YAML file with flag values")
	if err := parseFlags(fs, args, env.stdout, parallelGroupsSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.WorldSize <= 0 {
		return fmt.Errorf("--world-size %d: want a positive number of ranks", cfg.WorldSize)
	}
	l, err := parallel.NewLayout(cfg)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("{")
	for i, k := range parallel.Kinds() {
		if i > 0 {
			b.WriteString(",")
		}
		key, _ := json.Marshal(string(k))
		val, err := json.Marshal(l.Groups(k))
		if err != nil {
			return err
		}
		b.Write(key)
		b.WriteString(":")
		b.Write(val)
	}
	b.WriteString("}\n")
	_, err = fmt.Fprint(env.stdout, b.String())
	return err
}
