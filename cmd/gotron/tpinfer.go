package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/ckpt/megatron"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/train"
)

// Model-parallel decoding (gotron inference, generate and serve with
// --tensor-model-parallel-size N and/or --pipeline-model-parallel-size P):
// N×P ranks, started by gotron launch (or torchrun, srun, mpirun; --inproc
// for goroutines), each read their part of the checkpoint (the splits of
// training: gpt.Parallelize, then gpt.SplitStages; loadForDecoding) and
// decode in
// lockstep; rank 0 takes the requests and prints or serves, the others
// follow it (infer.Lockstep, infer.Follow). Pipeline stages pass hidden
// states along and the last one draws the tokens for all
// (infer.NewPipelineEngine).

// decodeGroup is a decoding command's model-parallel layout: the launched
// world, whose rank 0 leads the lockstep (reads the requests, prints or
// serves), and this rank's tensor-parallel group and pipeline stage in it
// (Megatron's rank order: tensor-parallel ranks fastest).
type decodeGroup struct {
	world  comm.ProcessGroup
	groups *parallel.Groups
	tp, pp int
}

// kind names the split, for the followers' lines and errors.
func (g *decodeGroup) kind() string {
	switch {
	case g.pp == 1:
		return "tensor-parallel"
	case g.tp == 1:
		return "pipeline-parallel"
	}
	return "tensor- and pipeline-parallel"
}

// leader reports whether this rank leads: rank 0, or one process (g nil).
func (g *decodeGroup) leader() bool { return g == nil || g.world.Rank() == 0 }

// decodeSizes says "--tensor-model-parallel-size N" and/or
// "--pipeline-model-parallel-size P", the sizes above 1.
func decodeSizes(tpSize, ppSize int) string {
	var sizes []string
	if tpSize > 1 || ppSize == 1 {
		sizes = append(sizes, fmt.Sprintf("--tensor-model-parallel-size %d", tpSize))
	}
	if ppSize > 1 {
		sizes = append(sizes, fmt.Sprintf("--pipeline-model-parallel-size %d", ppSize))
	}
	return strings.Join(sizes, " with ")
}

// joinDecodeGroup returns the model-parallel group of a decoding command:
// nil for one process (both sizes 1), else the launched world, which must
// have exactly tpSize×ppSize ranks. args are the command's arguments,
// whose hash every rank must share.
func joinDecodeGroup(ctx context.Context, env *cli, tpSize, ppSize int, timeout time.Duration, args []string) (*decodeGroup, func(), error) {
	if err := checked.Range("--tensor-model-parallel-size", int64(tpSize), 1, math.MaxInt32); err != nil {
		return nil, nil, err
	}
	if err := checked.Range("--pipeline-model-parallel-size", int64(ppSize), 1, math.MaxInt32); err != nil {
		return nil, nil, err
	}
	want, ok := checked.MulInt(tpSize, ppSize)
	if !ok {
		return nil, nil, fmt.Errorf("%s: too many ranks", decodeSizes(tpSize, ppSize))
	}
	if timeout <= 0 {
		timeout = defaultDistributedTimeout
	}
	world, closeWorld, err := joinWorld(ctx, env, timeout, "gloo", joinOptions{heartbeatTimeout: tcp.DefaultHeartbeatTimeout, flagsHash: flagsHash(args)})
	if err != nil {
		return nil, nil, err
	}
	size := 1
	if world != nil {
		size = world.Size()
	}
	switch {
	case size == 1 && want > 1:
		closeWorld()
		return nil, nil, fmt.Errorf("%s needs %d ranks: start them with gotron launch --nproc-per-node %d (or torchrun, srun, mpirun)", decodeSizes(tpSize, ppSize), want, want)
	case size != want:
		closeWorld()
		return nil, nil, fmt.Errorf("a world of %d ranks with %s: needs data-parallel inference replicas, not built in gotron: launch as many ranks as the model-parallel sizes' product (%d)", size, decodeSizes(tpSize, ppSize), want)
	case size == 1:
		return nil, closeWorld, nil
	}
	groups, err := parallel.NewGroups(world, parallel.Config{TP: tpSize, PP: ppSize})
	if err != nil {
		closeWorld()
		return nil, nil, err
	}
	return &decodeGroup{world: world, groups: groups, tp: tpSize, pp: ppSize}, closeWorld, nil
}

// decodeModel is this rank's part of a model for decoding.
type decodeModel struct {
	// m is what the engine reads: the whole model, its tensor-parallel
	// slice, or the pipeline stage's tensors (gpt.Stage.DecodeModel).
	m *gpt.Model
	// stage and pp are the pipeline stage and group (pipeline
	// parallelism only).
	stage *gpt.Stage
	pp    comm.ProcessGroup
}

// shardForDecoding returns this rank's part of m over g (m itself for one
// process): its tensor-parallel slice, then its pipeline stage (training's
// splits), naming the flag a model that does not split refuses.
func shardForDecoding(m *gpt.Model, g *decodeGroup) (decodeModel, error) {
	if g == nil {
		return decodeModel{m: m}, nil
	}
	if err := checkDecodeSplit(&m.Config, g); err != nil {
		return decodeModel{}, err
	}
	if g.tp > 1 {
		sliced := m // sliced by loadForDecoding already
		if m.Sharding == nil {
			var err error
			if sliced, err = gpt.Parallelize(m, &tp.Region{Group: g.groups.TP}, nil); err != nil {
				return decodeModel{}, fmt.Errorf("--tensor-model-parallel-size %d: %w", g.tp, err)
			}
		}
		if m.Config.MoE.Enabled() {
			// each routed expert over the tensor-parallel ranks
			// (Megatron's expert tensor parallelism at its default, the
			// TP size), no expert parallelism
			if err := sliced.SplitExpertsOverTP(); err != nil {
				return decodeModel{}, fmt.Errorf("--tensor-model-parallel-size %d: %w", g.tp, err)
			}
		}
		m = sliced
	}
	if g.pp == 1 {
		return decodeModel{m: m}, nil
	}
	stages, err := gpt.SplitStages(m, gpt.PipelineSplit{PP: g.pp}, g.groups.Coords.PP)
	if err != nil {
		return decodeModel{}, fmt.Errorf("--pipeline-model-parallel-size %d: %w", g.pp, err)
	}
	stages[0].DropOtherStages() // this rank keeps its stage's weights alone
	return decodeModel{m: stages[0].DecodeModel(), stage: stages[0], pp: g.groups.PP}, nil
}

// checkDecodeSplit refuses a model that does not split over g, naming the
// flag.
func checkDecodeSplit(c *gpt.Config, g *decodeGroup) error {
	if g.pp > 1 {
		// Checked before the split, whose error would suggest the uneven
		// split's flags, which decoding does not take.
		layers := c.NumLayers
		switch {
		case g.pp > layers:
			return fmt.Errorf("--pipeline-model-parallel-size %d: more stages than the model's %d layers (--num-layers): every stage needs one", g.pp, layers)
		case layers%g.pp != 0:
			return fmt.Errorf("--pipeline-model-parallel-size %d: the model's %d layers (--num-layers) are not divisible into %d stages (decoding splits the layers evenly)", g.pp, layers, g.pp)
		}
	}
	return nil
}

// loadForDecoding loads the model under dir for a decoding command over g
// and returns where its tokenizer files live. A gotron checkpoint decoded
// over several ranks is read in part (train.LoadModelPart): this rank's
// pipeline stage, sliced for its tensor-parallel rank, so no rank holds the
// whole model; shardForDecoding then keeps it as it is. A Hugging Face
// directory over pipeline stages is imported in part too (the stage's
// tensors whole, then sliced). Anything else (one process, a Megatron-LM
// directory, a Hugging Face one over tensor-parallel ranks alone) is loaded
// whole.
func loadForDecoding(dir string, g *decodeGroup) (*gpt.Model, string, error) {
	if g != nil && g.pp > 1 && hf.IsHFDir(dir) {
		// the stage's tensors, whole: shardForDecoding slices them
		m, _, err := hf.Import(dir, hf.ImportOptions{Part: func(c gpt.Config) (gpt.Part, error) {
			part, err := g.part(c)
			part.TP = nil
			return part, err
		}})
		return m, dir, err
	}
	if g == nil || hf.IsHFDir(dir) || megatron.IsMegatronDir(dir) {
		m, _, tokDir, err := loadAny(dir)
		return m, tokDir, err
	}
	m, _, _, err := train.LoadModelPart(dir, g.part)
	return m, filepath.Join(dir, hf.TokenizerDir), err
}

// part is this rank's part of a model of configuration c (training's
// splits: the even layer ranges of gpt.SplitStages, gpt.Parallelize's
// slices).
func (g *decodeGroup) part(c gpt.Config) (gpt.Part, error) {
	if err := checkDecodeSplit(&c, g); err != nil {
		return gpt.Part{}, err
	}
	pp := g.groups.Coords.PP
	ranges, err := gpt.PipelineSplit{PP: g.pp}.LayerRanges(c.NumLayers, pp)
	if err != nil {
		return gpt.Part{}, fmt.Errorf("--pipeline-model-parallel-size %d: %w", g.pp, err)
	}
	part := gpt.Part{FirstLayer: ranges[0][0], EndLayer: ranges[0][1], Embedding: pp == 0, Head: pp == g.pp-1}
	if g.tp > 1 {
		if err := c.CheckTP(g.tp, false, 0); err != nil {
			return gpt.Part{}, fmt.Errorf("--tensor-model-parallel-size %d: %w", g.tp, err)
		}
		part.TP = &tp.Region{Group: g.groups.TP}
	}
	return part, nil
}

// newEngine is infer.NewEngine of dm, or infer.NewPipelineEngine of its
// stage; ctx governs the stages' transfers.
func (dm decodeModel) newEngine(ctx context.Context, ec infer.EngineConfig) (*infer.Engine, error) {
	if dm.stage == nil {
		return infer.NewEngine(dm.m, ec)
	}
	return infer.NewPipelineEngine(infer.PipelineStage{Stage: dm.stage, Group: dm.pp, Ctx: ctx}, ec)
}

// decodeEngine is what a decoding loop calls on its engine: an
// infer.Engine alone, or rank 0's infer.Lockstep over the group's engines.
type decodeEngine interface {
	Add(infer.Request) (infer.SeqID, error)
	Cancel(infer.SeqID) bool
	Step() ([]infer.Event, error)
	HasWork() bool
	Stats() infer.Stats
}

// leadOrFollow runs one engine's work on every rank of group: on rank 0 run
// with the Lockstep that mirrors its calls (eng itself without a group),
// elsewhere infer.Follow. It reports whether this rank led.
func leadOrFollow(ctx context.Context, g *decodeGroup, eng *infer.Engine, run func(decodeEngine) error) (led bool, err error) {
	if g == nil {
		return true, run(eng)
	}
	group := g.world
	if group.Rank() != 0 {
		return false, infer.Follow(ctx, eng, group)
	}
	ls, err := infer.NewLockstep(ctx, eng, group)
	if err != nil {
		return true, err
	}
	err = run(ls)
	// Close tells the followers the leader is done, also when the leader
	// failed on its own (a bad request): they end instead of waiting for
	// it. After a failed step it sends nothing.
	return true, errors.Join(err, ls.Close())
}

// broadcastPrompt returns rank 0's prompt on every rank of group.
func broadcastPrompt(ctx context.Context, group comm.ProcessGroup, p []int32) ([]int32, error) {
	n := []int64{int64(len(p))}
	if err := group.Broadcast(ctx, comm.Int64s(n), 0); err != nil {
		return nil, fmt.Errorf("rank %d: rank 0's prompt: %w", group.Rank(), err)
	}
	if n[0] < 1 || n[0] > math.MaxInt32 {
		return nil, fmt.Errorf("rank %d: rank 0's prompt of %d tokens: want 1..%d", group.Rank(), n[0], math.MaxInt32)
	}
	if group.Rank() != 0 {
		p = make([]int32, n[0])
	}
	if err := group.Broadcast(ctx, comm.Int32s(p), 0); err != nil {
		return nil, fmt.Errorf("rank %d: rank 0's prompt: %w", group.Rank(), err)
	}
	return p, nil
}
