package train

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
)

// moeTPLayout is one MoE layout with tensor parallelism.
type moeTPLayout struct {
	world    int
	pc       parallel.Config
	alltoall bool
	shared   bool // a gated shared expert (split as the dense MLP)
	seqAux   bool // seq_aux_loss instead of aux_loss
	bias     bool // a sigmoid router with expert bias (counts summed over TP and DP)
	dist     bool // the distributed optimizer with overlapped reductions
	pp       int  // pipeline stages
}

func (l moeTPLayout) String() string {
	d := "allgather"
	if l.alltoall {
		d = "alltoall"
	}
	s := fmt.Sprintf("TP=%d EP=%d ETP=%d SP %s on %d ranks", l.pc.TP, max(l.pc.EP, 1), l.pc.ETP, d, l.world)
	if l.shared {
		s += " shared expert"
	}
	if l.seqAux {
		s += " seq_aux_loss"
	}
	if l.bias {
		s += " expert bias"
	}
	if l.dist {
		s += " distributed optimizer"
	}
	if l.pp > 1 {
		s += fmt.Sprintf(" PP=%d", l.pp)
	}
	return s
}

// runMoETP trains cfg on l.world inproc ranks laid out as l (world 0: one
// process) with sequence parallelism; each rank's params are whole tensors
// (gathered over TP, its own experts by their global names).
func runMoETP(t *testing.T, cfg Config, l moeTPLayout, src datagpt.Source) []dpRun {
	t.Helper()
	runs := make([]dpRun, max(l.world, 1))
	body := func(ctx context.Context, pg comm.ProcessGroup) error {
		c := cfg
		rank := 0
		if pg != nil {
			g, err := parallel.NewGroups(pg, l.pc)
			if err != nil {
				return err
			}
			c.Parallel, rank = g, pg.Rank()
			c.SequenceParallel = g.TP.Size() > 1
			if l.dist {
				c.DDP = ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, OverlapParamGather: true, BucketSize: 1000}
			}
			if l.pp > 1 {
				c.Pipeline = gpt.PipelineSplit{PP: l.pp}
			}
		}
		c.MoEAllToAll = l.alltoall
		tr, err := New(c, src, nil)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		if err := tr.stepper.syncParams(); err != nil {
			return err
		}
		if tr.stepper.pipelined() {
			if err := tr.gatherPipeline(); err != nil {
				return err
			}
			if tr.stepper.par.PP.Rank() != 0 {
				runs[rank] = dpRun{res: res, params: nil}
				return nil
			}
		}
		whole, err := tr.wholeParams()
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		ps := map[string][]float32{}
		for name, v := range whole {
			buf := make([]float32, v.NumElements())
			if err := v.DecodeFloat32(buf); err != nil {
				return err
			}
			ps[name] = buf
		}
		for _, b := range tr.stepper.buffers() {
			ps[b.Name] = slices.Clone(b.Float32s())
		}
		runs[rank] = dpRun{res: res, params: ps}
		return nil
	}
	var err error
	if l.world == 0 {
		err = body(context.Background(), nil)
	} else {
		err = inproc.Run(context.Background(), l.world, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// checkSameMoERun compares every rank's lm, aux and z losses at each
// iteration (and the grad norm) with one process's within 1e-5, and its
// whole parameters at the end.
func checkSameMoERun(t *testing.T, what string, ref dpRun, got []dpRun, lbName string) {
	t.Helper()
	for r, run := range got {
		if len(run.res.Losses) != len(ref.res.Losses) || len(run.res.MoELosses) != len(ref.res.MoELosses) {
			t.Fatalf("%s rank %d: %d losses, %d MoE loss records; want %d", what, r, len(run.res.Losses), len(run.res.MoELosses), len(ref.res.Losses))
		}
		for i := range ref.res.Losses {
			if !relClose(run.res.Losses[i], ref.res.Losses[i], 1e-5) {
				t.Fatalf("%s rank %d iteration %d: lm loss %.9g, one process %.9g", what, r, i+1, run.res.Losses[i], ref.res.Losses[i])
			}
			if !relClose(run.res.GradNorms[i], ref.res.GradNorms[i], 1e-5) {
				t.Fatalf("%s rank %d iteration %d: grad norm %.9g, one process %.9g", what, r, i+1, run.res.GradNorms[i], ref.res.GradNorms[i])
			}
			for _, name := range []string{lbName, "z_loss"} {
				g, w := run.res.MoELosses[i][name], ref.res.MoELosses[i][name]
				if w == 0 || !relClose(g, w, 1e-5) {
					t.Fatalf("%s rank %d iteration %d: %s %.9g, one process %.9g", what, r, i+1, name, g, w)
				}
			}
		}
		if run.params == nil {
			continue // a later pipeline stage: its parameters are checked on the first
		}
		if len(run.params) == 0 {
			t.Fatalf("%s rank %d: no parameters", what, r)
		}
		for name, v := range run.params {
			w, ok := ref.params[name]
			if !ok || len(w) != len(v) {
				t.Fatalf("%s rank %d: %s (%d values) is not one process's parameter (%d)", what, r, name, len(v), len(w))
			}
			for i := range v {
				if !relClose(float64(v[i]), float64(w[i]), 1e-5) {
					t.Fatalf("%s rank %d: %s[%d] = %.9g, one process %.9g", what, r, name, i, v[i], w[i])
				}
			}
		}
	}
}

// TestMoETensorParallelMatchesOneProcess: a tiny Mixtral-style model (8
// experts, top-2, aux and z losses, no dropping) on a real .bin/.idx
// dataset, with tensor and sequence parallelism composed with expert
// parallelism — EP=2×TP=2 with expert TP 1 (each rank routes its sequence
// shard; the experts whole, exchanged over EP) and with expert TP 2 (each
// expert's fc1 rows and fc2 columns split over the TP ranks) — gives one
// process's lm, aux and z losses and grad norm at each of 10 iterations
// within 1e-5, and its parameters at the end (gathered over TP). The
// default run takes two layouts; GOTRON_MOE_TP_FULL=1 runs all of them
// (both dispatchers, TP without EP, a gated shared expert, seq_aux_loss,
// a sigmoid router's expert bias, the distributed optimizer with overlapped
// reductions, and PP=2 on 8 ranks).
func TestMoETensorParallelMatchesOneProcess(t *testing.T) {
	full := os.Getenv("GOTRON_MOE_TP_FULL") == "1"
	cfg := moeTrainConfig()
	cfg.SeqLength = 16
	src, _ := dpDataset(t, cfg.SeqLength)
	refs := map[[3]bool]dpRun{}
	for i, l := range []moeTPLayout{
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 1}, alltoall: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 2}, alltoall: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 1}},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 2}},
		{world: 2, pc: parallel.Config{TP: 2, ETP: 1}, alltoall: true},
		{world: 2, pc: parallel.Config{TP: 2, ETP: 2}},
		{world: 2, pc: parallel.Config{TP: 2, ETP: 2}, alltoall: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 2}, alltoall: true, shared: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 1}, seqAux: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 1}, alltoall: true, bias: true},
		{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 2}, alltoall: true, dist: true},
		{world: 8, pc: parallel.Config{TP: 2, EP: 2, ETP: 2, PP: 2}, alltoall: true, pp: 2},
	} {
		if !full && i >= 2 {
			continue
		}
		c := cfg
		if l.shared {
			c.Model.MoE.SharedExpertFFN, c.Model.MoE.SharedExpertGate = 32, true
		}
		lb := "load_balancing_loss"
		if l.seqAux {
			c.Model.MoE.AuxLossCoeff, c.Model.MoE.SeqAuxLossCoeff = 0, 1e-2
			lb = "seq_load_balancing_loss"
		}
		if l.bias {
			c.Model.MoE.Score, c.Model.MoE.ExpertBias, c.Model.MoE.ExpertBiasUpdateRate = gpt.ScoreSigmoid, true, 0.05
		}
		key := [3]bool{l.shared, l.seqAux, l.bias}
		ref, ok := refs[key]
		if !ok {
			ref = runMoETP(t, c, moeTPLayout{}, src)[0]
			refs[key] = ref
		}
		checkSameMoERun(t, l.String(), ref, runMoETP(t, c, l, src), lb)
	}
}

// TestMoETensorParallelCheckpointResumes: a checkpoint saved at
// EP=2×TP=2×ETP=2 (each expert written as its whole tensor, in the TP
// ranks' slices) resumes in one process (EP=1, TP=1) with the losses of
// the uninterrupted run within 1e-5; and one saved in one process resumes
// at EP=2×TP=2×ETP=2.
func TestMoETensorParallelCheckpointResumes(t *testing.T) {
	cfg := moeTrainConfig()
	src, _ := dpDataset(t, cfg.SeqLength)
	one := moeTPLayout{}
	split := moeTPLayout{world: 4, pc: parallel.Config{TP: 2, EP: 2, ETP: 2}, alltoall: true}
	straight := runMoETP(t, cfg, one, src)[0]
	for _, c := range [][2]moeTPLayout{{split, one}, {one, split}} {
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 5
		a := runMoETP(t, first, c[0], src)[0]
		if a.res.Iteration != 5 {
			t.Fatalf("first half stopped at iteration %d", a.res.Iteration)
		}
		second := cfg
		second.Load = dir
		for r, run := range runMoETP(t, second, c[1], src) {
			got := append(slices.Clone(a.res.Losses), run.res.Losses...)
			if len(got) != len(straight.res.Losses) {
				t.Fatalf("saved at %v, resumed at %v: %d iterations, want %d", c[0], c[1], len(got), len(straight.res.Losses))
			}
			for i := range got {
				if !relClose(got[i], straight.res.Losses[i], 1e-5) {
					t.Fatalf("saved at %v, resumed at %v: rank %d iteration %d loss %.9g, straight %.9g", c[0], c[1], r, i+1, got[i], straight.res.Losses[i])
				}
			}
		}
	}
}

// TestMoETensorParallelBadLayouts: the MoE layouts with tensor parallelism
// that cannot run are refused before training, naming the flags.
func TestMoETensorParallelBadLayouts(t *testing.T) {
	cfg := moeTrainConfig()
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	for _, c := range []struct {
		world int
		pc    parallel.Config
		sp    bool
		want  string
	}{
		{4, parallel.Config{TP: 2, EP: 2, ETP: 1}, false, "needs --sequence-parallel"},
		{4, parallel.Config{TP: 2, EP: 1, ETP: 4}, true, "--expert-tensor-parallel-size=4 with --tensor-model-parallel-size=2: not built yet"},
	} {
		err := inproc.Run(context.Background(), c.world, func(ctx context.Context, pg comm.ProcessGroup) error {
			g, err := parallel.NewGroups(pg, c.pc)
			if err != nil {
				return err
			}
			cc := cfg
			cc.Parallel, cc.SequenceParallel = g, c.sp
			_, err = New(cc, src, nil)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.pc, err, c.want)
		}
	}
	// EP×ETP must divide the world
	if _, err := parallel.NewGroups(solo{}, parallel.Config{TP: 1, EP: 2, ETP: 2}); err == nil || !strings.Contains(err.Error(), "ETP·EP·PP") {
		t.Errorf("EP=2×ETP=2 on one rank: %v", err)
	}
}
