package main

import (
	"context"
	"errors"
	"flag"
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
	"github.com/gotron/gotron/parallel/ep"
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
//
// With --expert-model-parallel-size E (and --expert-tensor-parallel-size
// Q, Megatron's default the tensor-parallel size) each rank holds the
// experts of its expert-parallel rank (a slice of each with Q > 1), read
// alone from a gotron checkpoint or a Hugging Face directory. The ranks are Megatron's layout's:
// P × lcm(N, E·Q), the ranks beyond N×P being data-parallel replicas of the
// dense layers that decode the same requests (gotron has no data-parallel
// inference). Every rank of a stage holds the same tokens and routes them
// alike, so a step's tokens need no all-to-all: each rank runs its experts
// on the tokens routed to them and the partial outputs are all-reduced over
// the expert tensor × model parallel group (gpt.Model.DecodeExperts).

// decodeGroup is a decoding command's model-parallel layout: the launched
// world, whose rank 0 leads the lockstep (reads the requests, prints or
// serves), and this rank's tensor-parallel group and pipeline stage in it
// (Megatron's rank order: tensor-parallel ranks fastest).
type decodeGroup struct {
	world  comm.ProcessGroup
	groups *parallel.Groups
	decodeLayout
	// experts is this rank's expert-parallel groups, with an expert layout
	// (decodeLayout.splitsExperts).
	experts *ep.Group
}

// decodeLayout is a decoding command's model-parallel sizes, its flags'.
type decodeLayout struct {
	tp, pp int
	// ep and etp are the expert-parallel and expert-tensor-parallel sizes
	// (etp 0: tp, Megatron's default).
	ep, etp int
}

// expertTP is the expert-tensor-parallel size.
func (l decodeLayout) expertTP() int {
	if l.etp == 0 {
		return l.tp
	}
	return l.etp
}

// splitsExperts reports whether the experts split otherwise than each over
// the tensor-parallel ranks (gpt.Model.SplitExpertsOverTP, the default).
func (l decodeLayout) splitsExperts() bool { return l.ep > 1 || l.expertTP() != l.tp }

// kind names the split, for the followers' lines and errors.
func (l decodeLayout) kind() string {
	var k []string
	if l.tp > 1 {
		k = append(k, "tensor")
	}
	if l.pp > 1 {
		k = append(k, "pipeline")
	}
	if l.splitsExperts() {
		k = append(k, "expert")
	}
	switch len(k) {
	case 0:
		return "model-parallel"
	case 1:
		return k[0] + "-parallel"
	}
	return strings.Join(k[:len(k)-1], "-, ") + "- and " + k[len(k)-1] + "-parallel"
}

// check refuses sizes out of range, naming the flag.
func (l decodeLayout) check() error {
	for _, c := range []struct {
		flag string
		v    int
		min  int64
	}{{"--tensor-model-parallel-size", l.tp, 1}, {"--pipeline-model-parallel-size", l.pp, 1},
		{"--expert-model-parallel-size", l.ep, 1}, {"--expert-tensor-parallel-size", l.etp, 0}} {
		if err := checked.Range(c.flag, int64(c.v), c.min, math.MaxInt32); err != nil {
			return err
		}
	}
	return nil
}

// worldSize is the ranks the layout takes: P × lcm(N, E·Q), Megatron's
// smallest world for it (divisible by N·P and by E·Q·P). check first.
func (l decodeLayout) worldSize() (int, error) {
	eq, ok := checked.MulInt(l.ep, l.expertTP())
	a, b := l.tp, eq
	for b != 0 {
		a, b = b, a%b
	}
	lcm := 0
	if ok {
		lcm, ok = checked.MulInt(l.tp/a, eq)
	}
	if ok {
		lcm, ok = checked.MulInt(lcm, l.pp)
	}
	if !ok || lcm > math.MaxInt32 {
		return 0, fmt.Errorf("%s: too many ranks", l)
	}
	return lcm, nil
}

// leader reports whether this rank leads: rank 0, or one process (g nil).
func (g *decodeGroup) leader() bool { return g == nil || g.world.Rank() == 0 }

// String says the layout's flags: "--tensor-model-parallel-size N" and
// those of the other sizes above 1 (and an expert-tensor-parallel size
// given other than the tensor-parallel one).
func (l decodeLayout) String() string {
	var sizes []string
	if l.tp > 1 || (l.pp == 1 && l.ep == 1) {
		sizes = append(sizes, fmt.Sprintf("--tensor-model-parallel-size %d", l.tp))
	}
	if l.pp > 1 {
		sizes = append(sizes, fmt.Sprintf("--pipeline-model-parallel-size %d", l.pp))
	}
	if l.ep > 1 {
		sizes = append(sizes, fmt.Sprintf("--expert-model-parallel-size %d", l.ep))
	}
	if l.expertTP() != l.tp {
		sizes = append(sizes, fmt.Sprintf("--expert-tensor-parallel-size %d", l.etp))
	}
	return strings.Join(sizes, " with ")
}

// joinDecodeGroup returns the model-parallel group of a decoding command:
// nil for one process (every size 1), else the launched world, which must
// have exactly the layout's ranks (decodeLayout.worldSize). args are the
// command's arguments, whose hash every rank must share.
func joinDecodeGroup(ctx context.Context, env *cli, l decodeLayout, timeout time.Duration, args []string) (*decodeGroup, func(), error) {
	if err := l.check(); err != nil {
		return nil, nil, err
	}
	want, err := l.worldSize()
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("%s needs %d ranks: start them with gotron launch --nproc-per-node %d (or torchrun, srun, mpirun)", l, want, want)
	case size != want:
		closeWorld()
		return nil, nil, fmt.Errorf("a world of %d ranks with %s: needs data-parallel inference replicas, not built in gotron: launch the layout's %d ranks (%s)", size, l, want, l.rankRule())
	case size == 1:
		return nil, closeWorld, nil
	}
	groups, err := parallel.NewGroups(world, parallel.Config{TP: l.tp, PP: l.pp, EP: l.ep, ETP: l.etp})
	if err != nil {
		closeWorld()
		return nil, nil, fmt.Errorf("%s: %w", l, err)
	}
	g := &decodeGroup{world: world, groups: groups, decodeLayout: l}
	if l.splitsExperts() {
		g.experts = &ep.Group{PG: groups.EP, TP: groups.ExpertTP, TPEP: groups.ExpertTPEP}
	}
	return g, closeWorld, nil
}

// expertParallelFlags defines generate's and serve's expert-parallel
// flags (Megatron's names, as training's).
func expertParallelFlags(fs *flag.FlagSet) (epSize, etpSize *int) {
	epSize = fs.Int("expert-model-parallel-size", 1, "MoE: split the experts over this many ranks (each holds num-experts/E, read alone from a gotron checkpoint); the ranks are pipeline stages × lcm(tensor-parallel size, E × expert-tensor-parallel size), as Megatron's layout, the ones beyond the tensor × pipeline ranks decoding the same requests")
	etpSize = fs.Int("expert-tensor-parallel-size", 0, "MoE: split each expert's fc1 rows and fc2 columns over this many ranks (0: the tensor-parallel size, Megatron's default)")
	return epSize, etpSize
}

// rankRule says how the layout's world size is found.
func (l decodeLayout) rankRule() string {
	if l.ep == 1 && l.expertTP() == l.tp {
		return "the model-parallel sizes' product"
	}
	return "pipeline stages × lcm(tensor-parallel size, expert-parallel × expert-tensor-parallel sizes), as Megatron's layout"
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
	expertsSplit := g.experts != nil && m.Config.MoE.Enabled()
	if g.tp > 1 {
		sliced := m // sliced by loadForDecoding already
		if m.Sharding == nil {
			var err error
			if sliced, err = gpt.Parallelize(m, &tp.Region{Group: g.groups.TP}, nil); err != nil {
				return decodeModel{}, fmt.Errorf("--tensor-model-parallel-size %d: %w", g.tp, err)
			}
		}
		if m.Config.MoE.Enabled() && !expertsSplit && !m.ExpertsOverTP() {
			// each routed expert over the tensor-parallel ranks
			// (Megatron's expert tensor parallelism at its default, the
			// TP size), no expert parallelism
			if err := sliced.SplitExpertsOverTP(); err != nil {
				return decodeModel{}, fmt.Errorf("--tensor-model-parallel-size %d: %w", g.tp, err)
			}
		}
		m = sliced
	}
	if expertsSplit {
		// each rank's experts, read alone by loadForDecoding from a gotron
		// checkpoint or a Hugging Face directory (else sliced here), the
		// partial outputs summed over the expert tensor × model parallel
		// group
		sum := &tp.Region{Group: g.groups.ExpertTPEP}
		if err := m.DecodeExperts(g.experts, sum.ReduceFrom); err != nil {
			return decodeModel{}, fmt.Errorf("%s: %w", g.decodeLayout, err)
		}
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
	if g.splitsExperts() {
		switch {
		case !c.MoE.Enabled() && g.ep > 1:
			return fmt.Errorf("--expert-model-parallel-size %d: the model has no experts (--num-experts)", g.ep)
		case !c.MoE.Enabled():
			return fmt.Errorf("--expert-tensor-parallel-size %d: the model has no experts (--num-experts)", g.etp)
		}
		if err := c.CheckExpertSplit(g.ep, g.expertTP()); err != nil {
			return fmt.Errorf("%s: %w", g.decodeLayout, err)
		}
	}
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
// and returns where its tokenizer files live. A gotron checkpoint or a
// Hugging Face directory decoded over several ranks is read in part
// (train.LoadModelPart, hf.ImportOptions.Part): this rank's pipeline stage,
// sliced for its tensor-parallel rank (and its experts, with an expert
// layout), so no rank holds or reads the whole model; shardForDecoding
// then keeps it as it is. Anything else (one process, a Megatron-LM
// directory) is loaded whole.
func loadForDecoding(dir string, g *decodeGroup) (*gpt.Model, string, error) {
	if g != nil && hf.IsHFDir(dir) {
		m, _, err := hf.Import(dir, hf.ImportOptions{Part: g.part})
		return m, dir, err
	}
	if g == nil || megatron.IsMegatronDir(dir) {
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
		// at the default expert layout each routed expert splits over the
		// tensor-parallel ranks (SplitExpertsOverTP's split), each rank
		// reading its slices alone
		part.ExpertsOverTP = g.experts == nil && c.MoE.Enabled()
	}
	if g.experts != nil && c.MoE.Enabled() {
		part.Experts = g.experts
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
