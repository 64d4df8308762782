package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/train"
)

const ckptInspectSynopsis = "ckpt inspect [--iteration N] [--json] DIR   (a checkpoint's iteration, arguments, layout and tensors)"

// ckptTensor is one tensor of an inspected checkpoint.
type ckptTensor struct {
	Group string `json:"group"`
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Bytes int64  `json:"bytes"`
	// Shards is the number of pieces the tensor is stored in: 1, since
	// this format writes every tensor whole whatever the parallel layout.
	Shards int `json:"shards"`
}

// ckptReport is what 'gotron ckpt inspect --json' prints.
type ckptReport struct {
	Dir        string         `json:"dir"`
	Iteration  int            `json:"iteration"`
	Iterations []int          `json:"iterations"`
	Meta       ckpt.Meta      `json:"meta"`
	Args       train.RunArgs  `json:"args"`
	Layout     string         `json:"layout"`
	Groups     map[string]int `json:"group_bytes"`
	Tensors    []ckptTensor   `json:"tensors"`
}

// cmdCkpt dispatches 'gotron ckpt inspect'.
func cmdCkpt(_ context.Context, env *cli, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(env.stdout, "Usage:\n  gotron %s\n", ckptInspectSynopsis)
		if len(args) == 0 {
			return fmt.Errorf("missing subcommand: inspect")
		}
		return errHelp
	}
	if args[0] != "inspect" {
		msg := fmt.Sprintf("unknown subcommand %q: want inspect", args[0])
		if s := nearest(args[0], []string{"inspect"}); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return fmt.Errorf("%s", msg)
	}
	fs := newFlags("ckpt inspect", ckptInspectSynopsis)
	iteration := fs.Int("iteration", -1, "the iteration to inspect (default: the latest, as latest_checkpointed_iteration.txt says)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	if err := parseFlags(fs, args[1:], env.stdout, ckptInspectSynopsis); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one checkpoint directory (the --save directory), got %d arguments", fs.NArg())
	}
	dir := fs.Arg(0)
	c, err := ckpt.Load(dir, *iteration)
	if err != nil {
		return err
	}
	defer c.Close()
	its, err := ckpt.List(dir)
	if err != nil {
		return err
	}
	r := ckptReport{Dir: dir, Iteration: c.Meta.Iteration, Iterations: its, Meta: c.Meta, Groups: map[string]int{},
		Layout: "every tensor whole (one shard): loads at any tensor, pipeline and data-parallel size"}
	if len(c.Meta.Args) > 0 {
		if err := json.Unmarshal(c.Meta.Args, &r.Args); err != nil {
			return fmt.Errorf("%s: iteration %d: args: %w", dir, c.Meta.Iteration, err)
		}
	}
	r.Meta.Args, r.Meta.RNGState, r.Meta.Scheduler = nil, nil, nil
	for _, g := range slices.Sorted(maps.Keys(c.Groups)) {
		for _, name := range slices.Sorted(maps.Keys(c.Groups[g])) {
			t := c.Groups[g][name]
			n, err := safetensors.ByteSize(t.DType, t.Shape)
			if err != nil {
				return fmt.Errorf("%s: %s/%s: %w", dir, g, name, err)
			}
			r.Tensors = append(r.Tensors, ckptTensor{Group: g, Name: name, DType: t.DType.String(), Shape: t.Shape, Bytes: int64(n), Shards: 1})
			r.Groups[g] += n
		}
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	w := env.stdout
	fmt.Fprintf(w, "checkpoint %s: iteration %d (saved iterations %v)\n", dir, r.Iteration, its)
	fmt.Fprintf(w, "consumed samples: train %d, validation %d; skipped %d; floating-point operations so far %.4g\n",
		r.Meta.ConsumedTrainSamples, r.Meta.ConsumedValidSamples, r.Meta.SkippedTrainSamples, r.Meta.FloatingPointOperationsSoFar)
	m := r.Args.Model
	if m.NumLayers > 0 {
		fmt.Fprintf(w, "model: %d layers, hidden %d, %d heads (%d query groups), ffn %d, vocab %d, %s, %s, position %s, seq-length %d\n",
			m.NumLayers, m.HiddenSize, m.NumAttentionHeads, max(m.NumQueryGroups, m.NumAttentionHeads), m.FFNHiddenSize, m.VocabSize,
			orDefault(m.Normalization, "LayerNorm"), orDefault(m.Activation, "gelu"), orDefault(m.PositionEmbeddingType, "learned_absolute"), r.Args.SeqLength)
	}
	if r.Args.OptimizerKind != "" {
		fmt.Fprintf(w, "optimizer: %s, %d steps\n", r.Args.OptimizerKind, r.Args.OptimizerSteps)
	}
	if argv, ok := r.Args.CLI["argv"]; ok {
		fmt.Fprintf(w, "saved by: gotron %v\n", argv)
	}
	fmt.Fprintf(w, "layout: %s\n", r.Layout)
	for _, g := range slices.Sorted(maps.Keys(r.Groups)) {
		fmt.Fprintf(w, "group %s: %d bytes\n", g, r.Groups[g])
	}
	fmt.Fprintf(w, "%-10s %-60s %-5s %-16s %12s %s\n", "group", "tensor", "dtype", "shape", "bytes", "shards")
	for _, t := range r.Tensors {
		fmt.Fprintf(w, "%-10s %-60s %-5s %-16s %12d %d\n", t.Group, t.Name, t.DType, shapeString(t.Shape), t.Bytes, t.Shards)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
