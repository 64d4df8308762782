package train

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/parallel/fsdp"
	"github.com/gotron/gotron/tensor"
)

// fsdpRun is one rank's outcome of runFSDP.
type fsdpRun struct {
	dpRun
	sizes    fsdp.Sizes
	released bool // every parameter released once the next step began
	gathers  int
}

// runFSDP trains cfg with sharding on tpSize × dp inproc ranks and returns
// every rank's outcome, the whole parameters gathered over TP.
func runFSDP(t *testing.T, cfg Config, tpSize, dp int, sharding Sharding, train, valid datagpt.Source) []fsdpRun {
	t.Helper()
	return runFSDPLayout(t, cfg, parallel.Config{TP: tpSize}, tpSize*dp, sharding, train, valid)
}

// runFSDPLayout is runFSDP on world ranks laid out as pc.
func runFSDPLayout(t *testing.T, cfg Config, pc parallel.Config, world int, sharding Sharding, train, valid datagpt.Source) []fsdpRun {
	t.Helper()
	runs := make([]fsdpRun, world)
	err := inproc.Run(context.Background(), world, func(ctx context.Context, pg comm.ProcessGroup) error {
		g, err := parallel.NewGroups(pg, pc)
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel, c.FSDP, c.SequenceParallel = g, sharding, pc.TP > 1
		tr, err := New(c, train, valid)
		if err != nil {
			return err
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", pg.Rank(), err)
		}
		ps, err := wholeFloat32s(tr)
		if err != nil {
			return err
		}
		sizes, ok := tr.FSDPSizes()
		if !ok {
			return fmt.Errorf("rank %d: no FSDP", pg.Rank())
		}
		run := fsdpRun{dpRun: dpRun{res: res, params: ps, optB: tr.OptimizerStateBytes()}, sizes: sizes, gathers: tr.stepper.fsdp.Gathers()}
		// What a rank holds between steps: the next step drops the whole
		// parameters the end of the run gathered.
		if err := tr.stepper.reducer.WaitParams(ctx); err != nil {
			return err
		}
		run.released = true
		for _, p := range tr.Model.Params() {
			run.released = run.released && (p.Released() || sharding == ShardOptimGrads)
		}
		runs[pg.Rank()] = run
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func dpRuns(rs []fsdpRun) []dpRun {
	out := make([]dpRun, len(rs))
	for i, r := range rs {
		out[i] = r.dpRun
	}
	return out
}

// TestFSDPMatchesDataParallel: fully sharded data parallelism (each
// layer's parameters all-gathered before its forward and backward,
// gradients reduce-scattered per layer and micro-batch, the optimizer on
// the shards) gives the single process's and plain data parallelism's lm
// loss at every one of 10 iterations, validation loss and final parameters
// within 1e-5: DP=2 and DP=4, ZeRO-3 and ZeRO-2, and DP=2 × TP=2 (with
// sequence parallelism), on GPT-2- and Llama-style models (tied and untied
// embeddings), 4 and 2 micro-batches per step.
func TestFSDPMatchesDataParallel(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 1
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		checkSameRun(t, name+" plain DP=2", ref, runDP(t, cfg, 2, ddp.Config{}, train, valid))
		for _, c := range []struct {
			tp, dp int
			s      Sharding
		}{{1, 2, ShardOptimGradsParams}, {1, 4, ShardOptimGradsParams}, {1, 2, ShardOptimGrads}, {2, 2, ShardOptimGradsParams}} {
			label := fmt.Sprintf("%s FSDP %s TP=%d DP=%d", name, c.s, c.tp, c.dp)
			got := runFSDP(t, cfg, c.tp, c.dp, c.s, train, valid)
			checkSameRun(t, label, ref, dpRuns(got))
			for r, g := range got {
				if !g.released {
					t.Fatalf("%s rank %d: parameters still whole between steps", label, r)
				}
				// 10 steps × 4/dp micro-batches (+ evaluations): every
				// layer gathered at least before each forward and backward
				if min := 10 * 8 / (c.dp * cfg.MicroBatchSize) * 2 * cfg.Model.NumLayers; c.s == ShardOptimGradsParams && g.gathers < min {
					t.Fatalf("%s rank %d: %d unit all-gathers, want ≥ %d (each layer before its forward and its backward)", label, r, g.gathers, min)
				}
			}
		}
	}
}

// TestFSDPComposes: FSDP with context parallelism (CP=2 × DP=2: the
// shards are over the data × context parallel group) and with full
// activation recomputation (a recomputed chunk of two layers is one
// gathered unit, its forward run again in backward while it is whole)
// gives the losses and parameters of the same run without FSDP; so does
// --calculate-per-token-loss (gradients summed, not pre-scaled by 1/DP).
func TestFSDPComposes(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["llama"])
	cfg.MicroBatchSize = 1
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	checkSameRun(t, "FSDP CP=2 DP=2", ref, dpRuns(runFSDPLayout(t, cfg, parallel.Config{CP: 2}, 4, ShardOptimGradsParams, train, valid)))
	rc := cfg
	rc.Recompute = gpt.Recompute{Full: true, Method: "uniform", NumLayers: 2}
	checkSameRun(t, "FSDP DP=2 with full recomputation", ref, dpRuns(runFSDP(t, rc, 1, 2, ShardOptimGradsParams, train, valid)))
	pt := cfg
	pt.CalculatePerTokenLoss = true
	checkSameRun(t, "FSDP DP=2 with --calculate-per-token-loss", runDP(t, pt, 0, ddp.Config{}, train, valid)[0],
		dpRuns(runFSDP(t, pt, 1, 2, ShardOptimGradsParams, train, valid)))
}

// TestFSDPShardsMemory: what a rank keeps between steps — parameter and
// gradient shards and optimizer state, measured on the buffers — is 1/DP
// of the unsharded model's (plus padding of under DP values per unit),
// the ranks' shards together hold every value once, and while a step runs
// the whole parameters and gradients held at once stay near two layers'
// and the embeddings', not the model's.
func TestFSDPShardsMemory(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	m.NumLayers = 6
	cfg := dpConfig(m)
	cfg.MicroBatchSize, cfg.TrainIters, cfg.EvalInterval = 1, 2, 0
	cfg.Schedule.LRWarmupIters = 0
	full := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0].optB
	for _, dp := range []int{2, 4} {
		got := runFSDP(t, cfg, 1, dp, ShardOptimGradsParams, train, valid)
		var optSum int64
		for r, g := range got {
			s := g.sizes
			units := int64(m.NumLayers + 1)
			if s.ParamShards*int64(dp) < s.Unsharded || s.ParamShards*int64(dp) >= s.Unsharded+units*int64(dp) {
				t.Fatalf("dp=%d rank %d: %d parameter values in shards for %d unsharded: want 1/%d (plus < %d padding per unit)", dp, r, s.ParamShards, s.Unsharded, dp, dp)
			}
			if s.GradShards != s.ParamShards {
				t.Fatalf("dp=%d rank %d: %d gradient values in shards, %d parameter values", dp, r, s.GradShards, s.ParamShards)
			}
			if g.optB > full/int64(dp)+4*2*units*int64(dp) {
				t.Fatalf("dp=%d rank %d: %d optimizer bytes, whole optimizer %d", dp, r, g.optB, full)
			}
			optSum += g.optB
			if bound := s.Unsharded; s.PeakWhole >= bound {
				t.Fatalf("dp=%d rank %d: up to %d values whole at once, the whole model has %d", dp, r, s.PeakWhole, s.Unsharded)
			}
			// (the layers are the largest units of this model)
			if bound := 2 * (s.Unsharded - int64(m.NumLayers-2)*s.LargestUnit); s.PeakWhole > bound {
				t.Fatalf("dp=%d rank %d: up to %d values whole at once, want ≤ %d (parameters and gradients of two layers and the embeddings)", dp, r, s.PeakWhole, bound)
			}
		}
		t.Logf("dp=%d: %+v, optimizer bytes %d of %d", dp, got[0].sizes, got[0].optB, full)
		if optSum != full {
			t.Fatalf("dp=%d: ranks hold %d optimizer bytes together, want exactly the whole %d", dp, optSum, full)
		}
	}
}

// TestFSDPCheckpointResumes: a run saved under FSDP at DP=2 (with
// --async-save) resumes
// without FSDP in one process, with plain data parallelism at DP=4 and
// with FSDP at DP=4 and at TP=2 × DP=2, each with the uninterrupted run's
// losses within 1e-5 (checkpoints hold whole tensors and the optimizer
// pieces as the distributed optimizer's).
func TestFSDPCheckpointResumes(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["llama"])
	cfg.MicroBatchSize, cfg.EvalInterval = 1, 0
	straight := runFSDP(t, cfg, 1, 2, ShardOptimGradsParams, train, valid)[0]
	dir := t.TempDir()
	first := cfg
	// saved every 2 iterations in the background (the copy overlapping
	// the next iteration), and at the exit
	first.Save, first.ExitInterval, first.SaveInterval, first.AsyncSave = dir, 5, 2, true
	a := runFSDP(t, first, 1, 2, ShardOptimGradsParams, train, valid)[0]
	second := cfg
	second.Load = dir
	check := func(label string, runs []dpRun) {
		t.Helper()
		for r, run := range runs {
			got := append(slices.Clone(a.res.Losses), run.res.Losses...)
			if len(got) != len(straight.res.Losses) {
				t.Fatalf("%s rank %d: %d iterations, want %d", label, r, len(got), len(straight.res.Losses))
			}
			for i := range straight.res.Losses {
				if !relClose(got[i], straight.res.Losses[i], 1e-5) {
					t.Fatalf("%s rank %d iteration %d: loss %.9g, straight FSDP run %.9g", label, r, i+1, got[i], straight.res.Losses[i])
				}
			}
		}
	}
	check("resumed in one process without FSDP", runDP(t, second, 0, ddp.Config{}, train, valid))
	check("resumed at DP=4 without FSDP", runDP(t, second, 4, ddp.Config{}, train, valid))
	check("resumed at DP=4 with FSDP", dpRuns(runFSDP(t, second, 1, 4, ShardOptimGradsParams, train, valid)))
	check("resumed at TP=2 × DP=2 with FSDP", dpRuns(runFSDP(t, second, 2, 2, ShardOptimGradsParams, train, valid)))
}

// TestFSDPRefusesWhatIsNotBuilt: pipeline parallelism and other devices
// are refused before training, naming the flags.
func TestFSDPRefusesWhatIsNotBuilt(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.MicroBatchSize = 1
	err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		g, err := parallel.NewGroups(pg, parallel.Config{PP: 2})
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel, c.FSDP = g, ShardOptimGradsParams
		_, err = New(c, train, valid)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "--pipeline-model-parallel-size=2") {
		t.Fatalf("FSDP with PP=2: %v, want a refusal naming --pipeline-model-parallel-size", err)
	}
	c := cfg
	c.FSDP, c.Device = ShardOptimGradsParams, tensor.Sim
	if _, err := New(c, train, valid); err == nil || !strings.Contains(err.Error(), "--device") {
		t.Fatalf("FSDP on the simulated device: %v, want a refusal naming --device", err)
	}
}

// TestFSDPMemoryReportMatchesMeasured: gotron memory's FSDP line (16/DP
// bytes per parameter of Megatron's parameter count) agrees within 2% with
// what a rank of a real FSDP run holds, measured on its buffers: parameter
// and gradient shards and the optimizer state (a Llama-style model: no
// biases, which Megatron's formula counts only roughly; and padding).
func TestFSDPMemoryReportMatchesMeasured(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["llama"]
	m.NumLayers = 4
	cfg := dpConfig(m)
	cfg.MicroBatchSize, cfg.TrainIters, cfg.EvalInterval = 1, 1, 0
	cfg.Schedule.LRWarmupIters = 0
	for _, dp := range []int{2, 4} {
		run := runFSDP(t, cfg, 1, dp, ShardOptimGradsParams, train, valid)[0]
		measured := float64(4*(run.sizes.ParamShards+run.sizes.GradShards) + run.optB)
		r, err := TheoreticalMemory(MemoryConfig{Model: m, SeqLength: 16, MicroBatchSize: 1, WorldSize: dp, FSDP: ShardOptimGradsParams})
		if err != nil {
			t.Fatal(err)
		}
		if !relClose(r.FSDPWeightAndOptimizerBytes, measured, 0.02) {
			t.Fatalf("dp=%d: the report's FSDP weight and optimizer bytes %.0f, a rank measured %.0f (parameter and gradient shards %d+%d values, optimizer %d bytes)",
				dp, r.FSDPWeightAndOptimizerBytes, measured, run.sizes.ParamShards, run.sizes.GradShards, run.optB)
		}
	}
}
