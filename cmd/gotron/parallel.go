package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/pp"
)

const parallelGroupsSynopsis = "parallel groups --world-size N [--tensor-model-parallel-size N] " +
	"[--pipeline-model-parallel-size N] [--context-parallel-size N] [--expert-model-parallel-size N] " +
	"[--expert-tensor-parallel-size N] [--virtual-pipeline-model-parallel-size N] " +
	"[--order tp-cp-ep-dp-pp | --use-tp-pp-dp-mapping] [--num-distributed-optimizer-instances N] [--rank R]"

const parallelScheduleSynopsis = "parallel schedule [--pipeline-model-parallel-size P] " +
	"[--virtual-pipeline-model-parallel-size V] --num-microbatches M " +
	"[--microbatch-group-size-per-virtual-pipeline-stage G] [--format json|text]"

// cmdParallel dispatches "gotron parallel <sub>".
func cmdParallel(ctx context.Context, env *cli, args []string) error {
	const want = "want 'parallel groups' or 'parallel schedule'"
	if len(args) == 0 {
		return fmt.Errorf("missing subcommand: %s (usage: gotron %s | gotron %s)", want,
			parallelGroupsSynopsis, parallelScheduleSynopsis)
	}
	switch args[0] {
	case "groups":
		return cmdParallelGroups(env, args[1:])
	case "schedule":
		return cmdParallelSchedule(env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintf(env.stdout, "Usage:\n  gotron %s\n      print the rank groups of a layout as JSON\n"+
			"  gotron %s\n      print each pipeline rank's forward/backward order (JSON) or time-line (text)\n",
			parallelGroupsSynopsis, parallelScheduleSynopsis)
		return errHelp
	}
	msg := fmt.Sprintf("unknown subcommand %q: %s", args[0], want)
	if strings.HasPrefix(args[0], "-") {
		msg = fmt.Sprintf("flag %s before the subcommand: want 'gotron parallel groups %s' or 'gotron parallel schedule %s'",
			args[0], args[0], args[0])
	}
	return fmt.Errorf("%s", msg)
}

// cmdParallelSchedule prints Megatron's pipeline schedule for every pipeline
// rank (package pp). JSON: {"ranks":[[["F",chunk,microbatch],["B",...],...],...]},
// one list per rank in execution order, sends and receives left out. Text:
// pp.WriteTimeline with forward 1 time unit and backward 2.
func cmdParallelSchedule(env *cli, args []string) error {
	fs := newFlags("parallel schedule", parallelScheduleSynopsis)
	var cfg pp.Config
	fs.IntVar(&cfg.PP, "pipeline-model-parallel-size", 1, "pipeline-parallel degree (number of pipeline ranks)")
	fs.IntVar(&cfg.VPP, "virtual-pipeline-model-parallel-size", 0,
		"model chunks per pipeline rank; 2 or more selects the interleaved schedule (0 or 1: none)")
	fs.IntVar(&cfg.Microbatches, "num-microbatches", 0, "micro-batches per iteration (required)")
	fs.IntVar(&cfg.GroupSize, "microbatch-group-size-per-virtual-pipeline-stage", 0,
		"interleaved schedule only: contiguous micro-batches each chunk runs in turn (0: the pipeline size)")
	format := fs.String("format", "json", "json: each rank's forward/backward passes; "+
		"text: a time-line per rank (forward 1 unit, backward 2, '.' idle)")
	fs.String("config", "", "YAML file with flag values")
	if err := parseFlags(fs, args, env.stdout, parallelScheduleSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *format != "json" && *format != "text" {
		return fmt.Errorf("--format %s: want json or text", *format)
	}
	lists, err := pp.Schedule(cfg)
	if err != nil {
		// "gotron parallel: " replaces the package's own prefix.
		return errors.New(strings.TrimPrefix(err.Error(), "pp: "))
	}
	if *format == "text" {
		return pp.WriteTimeline(env.stdout, cfg, 1, 2)
	}
	out := struct {
		Ranks [][][3]any `json:"ranks"`
	}{Ranks: make([][][3]any, len(lists))}
	for r, list := range lists {
		out.Ranks[r] = [][3]any{}
		for _, a := range list {
			if a.Op.Compute() {
				out.Ranks[r] = append(out.Ranks[r], [3]any{a.Op.String(), a.Chunk, a.Microbatch})
			}
		}
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.stdout, "%s\n", raw)
	return err
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
	tppp := fs.Bool("use-tp-pp-dp-mapping", false, "Megatron's switch to the order tp-cp-ep-pp-dp")
	fs.IntVar(&cfg.DistOptInstances, "num-distributed-optimizer-instances", 1, "distributed-optimizer instances: with more than 1, also print each instance (dist-opt-instance, expert-dist-opt-instance) and the groups across them (dist-opt-inter)")
	rank := fs.Int("rank", -1, "print only this rank's coordinates and groups")
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
	if *tppp {
		if cfg.Order != parallel.DefaultOrder {
			return fmt.Errorf("--use-tp-pp-dp-mapping sets the order tp-cp-ep-pp-dp; it conflicts with --order %s", cfg.Order)
		}
		cfg.Order = parallel.TPPPDPOrder
	}
	l, err := parallel.NewLayout(cfg)
	if err != nil {
		// "gotron parallel: " replaces the package's own prefix.
		return errors.New(strings.TrimPrefix(err.Error(), "parallel: "))
	}
	if *rank != -1 {
		return printRankGroups(env, l, *rank)
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
	for _, d := range distOptGroups(l) {
		val, err := json.Marshal(d.groups)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, ",%q:%s", d.key, val)
	}
	b.WriteString("}\n")
	_, err = fmt.Fprint(env.stdout, b.String())
	return err
}

// printRankGroups prints one rank's coordinates and the group of each kind
// holding it (null when none): {"rank":5,"coords":{...},"groups":{"tp":[4,5],...}}.
func printRankGroups(env *cli, l *parallel.Layout, rank int) error {
	c, err := l.Coords(rank)
	if err != nil {
		return fmt.Errorf("--rank %d: want 0..%d", rank, l.Config.WorldSize-1)
	}
	coords, err := json.Marshal(map[string]any{
		"tp": c.TP, "cp": c.CP, "dp": c.DP, "pp": c.PP, "expert-tp": c.ExpertTP, "ep": c.EP, "expert-dp": c.EDP,
		"first-stage": c.FirstStage, "last-stage": c.LastStage,
	})
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `{"rank":%d,"coords":%s,"groups":{`, rank, coords)
	for i, k := range parallel.Kinds() {
		if i > 0 {
			b.WriteString(",")
		}
		val, err := json.Marshal(l.GroupOf(k, rank))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%q:%s", k, val)
	}
	for _, d := range distOptGroups(l) {
		val, err := json.Marshal(d.of(rank))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, ",%q:%s", d.key, val)
	}
	b.WriteString("}}\n")
	_, err = fmt.Fprint(env.stdout, b.String())
	return err
}

// distOptGroup is one kind of distributed-optimizer instance group, printed
// by parallel groups with --num-distributed-optimizer-instances > 1.
type distOptGroup struct {
	key    string
	of     func(rank int) []int
	groups [][]int // every distinct group, in order of their lowest rank
}

// distOptGroups returns the instance groups of l (none with one instance).
func distOptGroups(l *parallel.Layout) []distOptGroup {
	if l.Config.DistOptInstances <= 1 {
		return nil
	}
	out := []distOptGroup{
		{key: "dist-opt-instance", of: func(r int) []int { g, _ := l.DistOptInstanceGroups(r); return g }},
		{key: "dist-opt-inter", of: func(r int) []int { _, g := l.DistOptInstanceGroups(r); return g }},
		{key: "expert-dist-opt-instance", of: l.DistOptExpertInstance},
	}
	for i := range out {
		seen := map[int]bool{}
		for r := range l.Config.WorldSize {
			if g := out[i].of(r); g != nil && !seen[g[0]] {
				seen[g[0]] = true
				out[i].groups = append(out[i].groups, g)
			}
		}
	}
	return out
}
