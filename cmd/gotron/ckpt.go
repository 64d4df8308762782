package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/train"
)

const ckptInspectSynopsis = "ckpt inspect [--iteration N] [--json] [--verify] DIR   (a checkpoint's iteration, arguments, layout and tensors)"

const ckptReshardSynopsis = "ckpt reshard DIR --out DIR2 [--tensor-model-parallel-size N] [--pipeline-model-parallel-size P] [--num-virtual-stages-per-pipeline-rank V] [--data-parallel-size D] [--use-distributed-optimizer]   (rewrite the latest checkpoint as that layout saves it)"

// ckptTensor is one tensor of an inspected checkpoint.
type ckptTensor struct {
	Group string `json:"group"`
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Bytes int64  `json:"bytes"`
	// Shards is the number of pieces the tensor is stored in (one per rank
	// that wrote a part of it; 1 in format 1, which stores it whole).
	Shards int `json:"shards"`
	// Pieces are the shards: file, global offset, shape, element range.
	Pieces []ckpt.ShardRecord `json:"pieces,omitempty"`
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
	Version    int            `json:"format_version"`
	Saved      ckpt.Layout    `json:"saved_layout"`
	Verified   bool           `json:"verified,omitempty"`
	Tensors    []ckptTensor   `json:"tensors"`
}

// cmdCkpt dispatches 'gotron ckpt inspect' and 'gotron ckpt reshard'.
func cmdCkpt(ctx context.Context, env *cli, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(env.stdout, "Usage:\n  gotron %s\n  gotron %s\n", ckptInspectSynopsis, ckptReshardSynopsis)
		if len(args) == 0 {
			return fmt.Errorf("missing subcommand: inspect or reshard")
		}
		return errHelp
	}
	if args[0] == "reshard" {
		return cmdCkptReshard(ctx, env, args[1:])
	}
	if args[0] != "inspect" {
		msg := fmt.Sprintf("unknown subcommand %q: want inspect or reshard", args[0])
		if s := nearest(args[0], []string{"inspect", "reshard"}); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return fmt.Errorf("%s", msg)
	}
	fs := newFlags("ckpt inspect", ckptInspectSynopsis)
	iteration := fs.Int("iteration", -1, "the iteration to inspect (default: the latest, as latest_checkpointed_iteration.txt says)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	verify := fs.Bool("verify", false, "read every shard, checking its CRC-32C and that every tensor is whole")
	if err := parseFlags(fs, args[1:], env.stdout, ckptInspectSynopsis); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one checkpoint directory (the --save directory), got %d arguments", fs.NArg())
	}
	dir := fs.Arg(0)
	c, err := ckpt.Open(dir, *iteration)
	if err != nil {
		return err
	}
	defer c.Close()
	its, err := ckpt.List(dir)
	if err != nil {
		return err
	}
	r := ckptReport{Dir: dir, Iteration: c.Meta.Iteration, Iterations: its, Meta: c.Meta, Groups: map[string]int{},
		Version: c.Version, Saved: c.Layout, Layout: layoutString(c)}
	if len(c.Meta.Args) > 0 {
		if err := json.Unmarshal(c.Meta.Args, &r.Args); err != nil {
			return fmt.Errorf("%s: iteration %d: args: %w", dir, c.Meta.Iteration, err)
		}
	}
	r.Meta.Args, r.Meta.RNGState, r.Meta.Scheduler = nil, nil, nil
	for _, g := range c.Groups() {
		ts := c.Tensors(g)
		for _, name := range slices.Sorted(maps.Keys(ts)) {
			t := ts[name]
			dt, err := safetensors.ParseDType(t.DType)
			if err != nil {
				return fmt.Errorf("%s: %s/%s: %w", dir, g, name, err)
			}
			n, err := safetensors.ByteSize(dt, t.Shape)
			if err != nil {
				return fmt.Errorf("%s: %s/%s: %w", dir, g, name, err)
			}
			if *verify {
				if _, _, err := c.ReadWhole(g, name); err != nil {
					return err
				}
			}
			ct := ckptTensor{Group: g, Name: name, DType: t.DType, Shape: t.Shape, Bytes: int64(n), Shards: len(t.Shards)}
			if *asJSON && c.Version >= 2 {
				ct.Pieces = t.Shards
			}
			r.Tensors = append(r.Tensors, ct)
			r.Groups[g] += n
		}
	}
	r.Verified = *verify
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
		groups := m.NumQueryGroups
		if groups == 0 { // the zero value: one group per head (no GQA)
			groups = m.NumAttentionHeads
		}
		fmt.Fprintf(w, "model: %d layers, hidden %d, %d heads (%d query groups), ffn %d, vocab %d, %s, %s, position %s, seq-length %d\n",
			m.NumLayers, m.HiddenSize, m.NumAttentionHeads, groups, m.FFNHiddenSize, m.VocabSize,
			m.Normalization, m.Activation, m.PositionEmbeddingType, r.Args.SeqLength)
	}
	if r.Args.OptimizerKind != "" {
		fmt.Fprintf(w, "optimizer: %s, %d steps\n", r.Args.OptimizerKind, r.Args.OptimizerSteps)
	}
	if argv, ok := r.Args.CLI["argv"]; ok {
		fmt.Fprintf(w, "saved by: gotron %v\n", argv)
	}
	fmt.Fprintf(w, "layout: %s\n", r.Layout)
	if r.Verified {
		fmt.Fprintf(w, "verified: every shard read, CRC-32C checked, every tensor whole\n")
	}
	for _, g := range slices.Sorted(maps.Keys(r.Groups)) {
		fmt.Fprintf(w, "group %s: %d bytes\n", g, r.Groups[g])
	}
	fmt.Fprintf(w, "%-10s %-60s %-5s %-16s %12s %s\n", "group", "tensor", "dtype", "shape", "bytes", "shards")
	for _, t := range r.Tensors {
		fmt.Fprintf(w, "%-10s %-60s %-5s %-16s %12d %d\n", t.Group, t.Name, t.DType, shapeString(t.Shape), t.Bytes, t.Shards)
	}
	return nil
}

// cmdCkptReshard is 'gotron ckpt reshard'.
func cmdCkptReshard(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("ckpt reshard", ckptReshardSynopsis)
	out := fs.String("out", "", "directory to write the resharded checkpoint to (not the input)")
	var l train.ReshardLayout
	fs.IntVar(&l.TP, "tensor-model-parallel-size", 1, "tensor-parallel size of the new layout")
	fs.IntVar(&l.PP, "pipeline-model-parallel-size", 1, "pipeline-parallel size of the new layout")
	fs.IntVar(&l.Pipeline.VPP, "num-virtual-stages-per-pipeline-rank", 0, "virtual pipeline stages per rank of the new layout")
	fs.IntVar(&l.Pipeline.FirstLayers, "decoder-first-pipeline-num-layers", 0, "layers of the first pipeline stage (uneven split)")
	fs.IntVar(&l.Pipeline.LastLayers, "decoder-last-pipeline-num-layers", 0, "layers of the last pipeline stage (uneven split)")
	fs.BoolVar(&l.Pipeline.AccountForEmbedding, "account-for-embedding-in-pipeline-split", false, "count the embedding as a layer of the even pipeline split (as train)")
	fs.BoolVar(&l.Pipeline.AccountForLoss, "account-for-loss-in-pipeline-split", false, "count the loss as a layer of the even pipeline split (as train)")
	fs.IntVar(&l.DP, "data-parallel-size", 1, "data-parallel size of the new layout (who writes which shard)")
	fs.BoolVar(&l.DistributedOptimizer, "use-distributed-optimizer", false, "shard the optimizer state over the data-parallel ranks, as --use-distributed-optimizer saves it")
	var dirs []string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") { // DIR first, as the synopsis writes it
		dirs, args = args[:1], args[1:]
	}
	if err := parseFlags(fs, args, env.stdout, ckptReshardSynopsis); err != nil {
		return err
	}
	dirs = append(dirs, fs.Args()...)
	if len(dirs) != 1 {
		return fmt.Errorf("want one checkpoint directory (the --save directory), got %d arguments", len(dirs))
	}
	if *out == "" {
		return fmt.Errorf("--out is required: the directory to write the resharded checkpoint to")
	}
	for name, v := range map[string]int{"--tensor-model-parallel-size": l.TP, "--pipeline-model-parallel-size": l.PP, "--data-parallel-size": l.DP} {
		if v < 1 {
			return fmt.Errorf("%s=%d: want ≥ 1", name, v)
		}
	}
	start := time.Now()
	it, err := train.Reshard(ctx, dirs[0], *out, l)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "resharded iteration %d of %s to %s: TP=%d PP=%d DP=%d (%d rank files) in %v\n",
		it, dirs[0], *out, l.TP, l.PP, l.DP, l.TP*l.PP*l.DP, time.Since(start).Round(time.Millisecond))
	return nil
}

// layoutString says how a checkpoint was saved and what loads it.
func layoutString(c *ckpt.Reader) string {
	if c.Version < 2 {
		return "format 1, every tensor whole (one shard): loads at any tensor, pipeline and data-parallel size"
	}
	l := c.Layout
	s := fmt.Sprintf("sharded, written by %d rank(s) at TP=%d PP=%d DP=%d", l.WorldSize, l.TensorParallel, l.PipelineParallel, l.DataParallel)
	if l.VirtualStages > 1 {
		s += fmt.Sprintf(" V=%d", l.VirtualStages)
	}
	if l.DistributedOptimizer {
		s += " with the distributed optimizer"
	}
	return s + ": loads at any tensor, pipeline and data-parallel size"
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
