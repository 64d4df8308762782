package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// TestMoEFLOPsAndMemoryMegatronValues: num_floating_point_operations and
// compute_weight_and_optimizer_memory with MoE terms, against the values
// Megatron's own functions give (../shared/spec/megatron-moe-cp.md §6).
func TestMoEFLOPsAndMemoryMegatronValues(t *testing.T) {
	mixtral := gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, NumQueryGroups: 8, FFNHiddenSize: 14336,
		Activation: gpt.SwiGLU, VocabSize: 32000, MaxPositionEmbeddings: 4096, Normalization: gpt.RMSNorm,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2}}
	qwen := gpt.Config{NumLayers: 24, HiddenSize: 2048, NumAttentionHeads: 16, FFNHiddenSize: 5632,
		Activation: gpt.SwiGLU, VocabSize: 151936, MaxPositionEmbeddings: 4096, DisableBiasLinear: true,
		MoE: gpt.MoEConfig{NumExperts: 64, TopK: 4, FFNHiddenSize: 1408, SharedExpertFFN: 2816, LayerFreq: "2"}}
	for _, c := range []struct {
		name string
		cfg  gpt.Config
		want float64
	}{{"mixtral", mixtral, 3.264776e14}, {"qwen-moe, every other layer", qwen, 4.800270e13}} {
		if err := c.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := FLOPsPerIteration(c.cfg, 1, 4096); math.Abs(got-c.want) > 5e-7*c.want {
			t.Errorf("%s: FLOPs %.6e, Megatron %.6e", c.name, got, c.want)
		}
	}
	r, err := TheoreticalMemory(MemoryConfig{Model: mixtral, SeqLength: 4096, MicroBatchSize: 1, WorldSize: 64,
		TensorParallel: 2, ExpertParallel: 8, ExpertTensorParallel: 1, DistributedOptimizer: true})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.TotalParams/1e9-46.70) > 0.005 || math.Abs(r.MostLoadedShardParams/1e9-6.4406) > 5e-5 {
		t.Errorf("params %.4f B, most loaded shard %.4f B; Megatron 46.70 B, 6.4406 B", r.TotalParams/1e9, r.MostLoadedShardParams/1e9)
	}
	if active := (r.ActiveBlockParams + r.EmbeddingParams) / 1e9; math.Abs(active-12.88) > 0.005 {
		t.Errorf("active params %.4f B, Megatron 12.88 B", active)
	}
	if want := 4.740074e10; math.Abs(r.WeightAndOptimizerBytes-want) > 5e-7*want {
		t.Errorf("weight and optimizer %.6e bytes, Megatron %.6e", r.WeightAndOptimizerBytes, want)
	}
}

// moeTrainConfig is a tiny Mixtral-style model (8 experts, top-2, aux and
// z losses, no dropping) trained for 10 iterations of 8 samples.
func moeTrainConfig() Config {
	cfg := tinyConfig(nil)
	cfg.Model = gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, VocabSize: 64,
		Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, PositionEmbeddingType: gpt.RoPE, DisableBiasLinear: true,
		MaxPositionEmbeddings: 16, UntieEmbeddingsAndOutputWeights: true, FFNHiddenSize: 64,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2, FFNHiddenSize: 24, AuxLossCoeff: 1e-2, ZLossCoeff: 1e-3, GroupedGEMM: true}}
	cfg.GlobalBatchSize, cfg.TrainIters, cfg.EvalIters = 8, 10, 0
	// SGD: an update proportional to the gradient (Adam's would hide a
	// wrong gradient scale)
	cfg.Optimizer, cfg.SGDMomentum = SGD, 0.9
	cfg.Schedule.LR, cfg.Schedule.MinLR = 0.5, 0.05
	return cfg
}

// runEP trains cfg on world inproc ranks with expert parallelism ep (world
// 0: one process).
func runEP(t *testing.T, cfg Config, world, ep int) []dpRun {
	t.Helper()
	return runMoE(t, cfg, world, parallel.Config{EP: ep})
}

// runMoE trains cfg on world inproc ranks laid out as pc (world 0: one
// process). Each rank's result holds the parameters it trains (its
// stages' under pipelining) by their whole-model names.
func runMoE(t *testing.T, cfg Config, world int, pc parallel.Config) []dpRun {
	t.Helper()
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	runs := make([]dpRun, max(world, 1))
	body := func(ctx context.Context, pg comm.ProcessGroup) error {
		c := cfg
		rank := 0
		if pg != nil {
			g, err := parallel.NewGroups(pg, pc)
			if err != nil {
				return err
			}
			c.Parallel, rank = g, pg.Rank()
		}
		tr, err := New(c, src, nil)
		if err != nil {
			return err
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		ps := map[string][]float32{}
		for _, p := range tr.stepper.localParams() {
			ps[p.Name] = slices.Clone(tensor.ToHost(p).Float32s())
		}
		for _, b := range tr.stepper.buffers() { // the expert biases, compared as parameters
			ps[b.Name] = slices.Clone(b.Float32s())
		}
		runs[rank] = dpRun{res: res, params: ps}
		return nil
	}
	var err error
	if world == 0 {
		err = body(context.Background(), nil)
	} else {
		err = inproc.Run(context.Background(), world, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// TestExpertParallelMatchesOneProcess: EP=2 (alltoall) and EP=4 (allgather)
// over as many inproc ranks, and EP=2 over 4 ranks (expert-data-parallel
// size 2), the ranks data-parallel for the dense weights,
// give the lm loss and the aux and z losses of one process at each of 10
// iterations within 1e-5, and the same parameters at the end (each rank
// holding its experts).
func TestExpertParallelMatchesOneProcess(t *testing.T) {
	cfg := moeTrainConfig()
	ref := runEP(t, cfg, 0, 1)[0]
	for _, c := range []struct {
		world, ep int
		alltoall  bool
		bias      bool
		dist      bool
	}{{2, 2, true, false, false}, {4, 4, false, false, false}, {4, 2, true, false, false}, {2, 2, true, true, false},
		{4, 2, true, false, true}, {4, 4, false, false, true}} {
		// EP=2 on 4 ranks: expert DP 2; then sigmoid with expert bias; then
		// the distributed optimizer with overlapped reductions (dense shards
		// over DP, expert shards over expert DP)
		c2 := cfg
		c2.MoEAllToAll = c.alltoall
		if c.dist {
			c2.DDP = ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, OverlapParamGather: true, BucketSize: 1000}
		}
		ref := ref
		if c.bias {
			c2.Model.MoE.Score, c2.Model.MoE.ExpertBias, c2.Model.MoE.ExpertBiasUpdateRate = gpt.ScoreSigmoid, true, 0.05
			ref = runEP(t, c2, 0, 1)[0]
		}
		if len(ref.res.Losses) != 10 {
			t.Fatalf("one process ran %d iterations, want 10", len(ref.res.Losses))
		}
		sameMoECurve(t, fmt.Sprintf("%+v", c), ref, runEP(t, c2, c.world, c.ep), true)
	}
}

// TestMoEPipelineParallelMatchesOneProcess: MoE with pipeline
// parallelism, PP=2 alone, EP=2×PP=2 (dense DP 2, the expert ranks
// within it) and EP=2×PP=2 interleaved (two chunks per rank, the first
// layer dense), gives the lm loss and the aux and z losses of one process at
// each of 10 iterations within 1e-5 (each stage's routers' losses summed
// over the pipeline ranks, as Megatron's tracker), and the same parameters
// at the end on every stage.
func TestMoEPipelineParallelMatchesOneProcess(t *testing.T) {
	cfg := moeTrainConfig()
	ref := runEP(t, cfg, 0, 1)[0]
	deep := cfg // four layers, the first dense: interleaved stages
	deep.Model.NumLayers, deep.Model.MoE.LayerFreq = 4, "[0,1,1,1]"
	deepRef := runEP(t, deep, 0, 1)[0]
	for _, c := range []struct {
		world int
		pc    parallel.Config
		vpp   int
		bias  bool
	}{{2, parallel.Config{PP: 2}, 0, false}, {4, parallel.Config{PP: 2, EP: 2}, 0, false}, {4, parallel.Config{PP: 2, EP: 2}, 2, false},
		{4, parallel.Config{PP: 2, EP: 2}, 0, true}} {
		c2, ref := cfg, ref
		if c.vpp > 0 {
			c2, ref = deep, deepRef
			c2.Pipeline.VPP = c.vpp
		}
		if c.bias { // each stage's routers' expert biases, their counts summed over DP
			c2.Model.MoE.Score, c2.Model.MoE.ExpertBias, c2.Model.MoE.ExpertBiasUpdateRate = gpt.ScoreSigmoid, true, 0.05
			ref = runEP(t, c2, 0, 1)[0]
		}
		c2.MoEAllToAll = true
		if len(ref.res.Losses) != 10 {
			t.Fatalf("one process ran %d iterations, want 10", len(ref.res.Losses))
		}
		sameMoECurve(t, fmt.Sprintf("%+v", c.pc), ref, runMoE(t, c2, c.world, c.pc), true)
	}
}

// sameMoECurve checks got's lm loss, grad norm and MoE losses at each of
// ref's iterations against ref's within 1e-5 and, with sameParams, its
// parameters (every one ref's, at least one) within 1e-4.
func sameMoECurve(t *testing.T, name string, ref dpRun, got []dpRun, sameParams bool) {
	t.Helper()
	for r, run := range got {
		if n := len(ref.res.Losses); len(run.res.Losses) != n || len(run.res.MoELosses) != n {
			t.Fatalf("%s rank %d: %d losses, %d MoE loss records; want %d", name, r, len(run.res.Losses), len(run.res.MoELosses), n)
		}
		for i := range ref.res.Losses {
			if !relClose(run.res.Losses[i], ref.res.Losses[i], 1e-5) || !relClose(run.res.GradNorms[i], ref.res.GradNorms[i], 1e-5) {
				t.Fatalf("%s rank %d iteration %d: lm loss %.8g grad norm %.8g, reference %.8g and %.8g", name, r, i+1,
					run.res.Losses[i], run.res.GradNorms[i], ref.res.Losses[i], ref.res.GradNorms[i])
			}
			for _, m := range []string{"load_balancing_loss", "z_loss"} {
				if g, w := run.res.MoELosses[i][m], ref.res.MoELosses[i][m]; !relClose(g, w, 1e-5) {
					t.Fatalf("%s rank %d iteration %d: %s %.8g, reference %.8g", name, r, i+1, m, g, w)
				}
			}
		}
		if !sameParams {
			continue
		}
		if len(run.params) == 0 {
			t.Fatalf("%s rank %d: no parameters", name, r)
		}
		for pn, v := range run.params {
			w, ok := ref.params[pn]
			if !ok || len(w) != len(v) {
				t.Fatalf("%s rank %d: %s (%d values) is not the reference's parameter (%d)", name, r, pn, len(v), len(w))
			}
			for i := range v {
				if !relClose(float64(v[i]), float64(w[i]), 1e-4) {
					t.Fatalf("%s rank %d: %s[%d] = %g, reference %g", name, r, pn, i, v[i], w[i])
				}
			}
		}
	}
}

// TestExpertParallelCheckpointResumes: an EP=2 checkpoint (each expert
// written once, by its expert-data-parallel rank 0, under its global name;
// with the distributed optimizer, its state's shards by every expert-DP
// rank), and an EP=2×PP=2 one (each stage writing its layers' experts),
// resume at EP=1, EP=2, EP=4 (with the distributed optimizer) and
// EP=2×PP=2 with the losses of an uninterrupted run within 1e-5.
func TestExpertParallelCheckpointResumes(t *testing.T) {
	cfg := moeTrainConfig()
	cfg.MoEAllToAll = true
	straight := runEP(t, cfg, 0, 1)[0]
	dist := ddp.Config{DistributedOptimizer: true}
	for _, save := range []struct {
		world int
		pc    parallel.Config
		dist  bool
	}{{2, parallel.Config{EP: 2}, false}, {4, parallel.Config{EP: 2}, true}, {4, parallel.Config{EP: 2, PP: 2}, false}} {
		// the second: expert shards of the optimizer state over expert DP
		// 2; the third: each pipeline stage writes its own layers' experts
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 5
		if save.dist {
			first.DDP = dist
		}
		a := runMoE(t, first, save.world, save.pc)[0]
		if a.res.Iteration != 5 {
			t.Fatalf("first half stopped at iteration %d", a.res.Iteration)
		}
		for _, c := range []struct {
			world int
			pc    parallel.Config
			dist  bool
		}{{0, parallel.Config{}, false}, {2, parallel.Config{EP: 2}, false}, {4, parallel.Config{EP: 4}, true},
			{4, parallel.Config{EP: 2, PP: 2}, false}} {
			second := cfg
			second.Load = dir
			if c.dist {
				second.DDP = dist
			}
			for r, run := range runMoE(t, second, c.world, c.pc) {
				got := append(slices.Clone(a.res.Losses), run.res.Losses...)
				if len(got) != len(straight.res.Losses) {
					t.Fatalf("%+v: %d iterations in all, want %d", c.pc, len(got), len(straight.res.Losses))
				}
				for i := range got {
					if !relClose(got[i], straight.res.Losses[i], 1e-5) {
						t.Fatalf("saved %+v, resumed %+v: rank %d iteration %d loss %.9g, straight %.9g", save, c, r, i+1, got[i], straight.res.Losses[i])
					}
				}
			}
		}
	}
}

// TestExpertBiasCheckpoint: the routers' expert biases are saved
// (decoder.layers.N.mlp.router.expert_bias) and restored, so a resumed run
// (one process, at EP=2 and at EP=2×PP=2, each stage holding its layers'
// biases) repeats the uninterrupted one: bit for bit in one process. A
// checkpoint saved at EP=2×PP=2 (each stage writing its own layers'
// biases) resumes in one process.
func TestExpertBiasCheckpoint(t *testing.T) {
	cfg := moeTrainConfig()
	cfg.Model.MoE.Score, cfg.Model.MoE.ExpertBias, cfg.Model.MoE.ExpertBiasUpdateRate = gpt.ScoreSigmoid, true, 0.05
	cfg.MoEAllToAll = true
	straight := runEP(t, cfg, 0, 1)[0]
	type layout struct {
		world int
		pc    parallel.Config
	}
	for _, save := range []struct {
		at      layout
		resumes []layout
	}{{layout{0, parallel.Config{}}, []layout{{0, parallel.Config{}}, {2, parallel.Config{EP: 2}}, {4, parallel.Config{EP: 2, PP: 2}}}},
		{layout{4, parallel.Config{EP: 2, PP: 2}}, []layout{{0, parallel.Config{}}}}} {
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 5
		a := runMoE(t, first, save.at.world, save.at.pc)[0]
		for _, c := range save.resumes {
			second := cfg
			second.Load = dir
			for r, run := range runMoE(t, second, c.world, c.pc) {
				got := append(slices.Clone(a.res.Losses), run.res.Losses...)
				bitwise := c.world == 0 && save.at.world == 0
				for i := range got {
					if (bitwise && got[i] != straight.res.Losses[i]) || !relClose(got[i], straight.res.Losses[i], 1e-5) {
						t.Fatalf("saved at %+v, resumed at %+v: rank %d iteration %d loss %.9g, straight %.9g", save.at.pc, c.pc, r, i+1, got[i], straight.res.Losses[i])
					}
				}
				biases := 0
				for name, v := range run.params {
					if !strings.HasSuffix(name, "expert_bias") {
						continue
					}
					biases++
					if !slices.Equal(v, straight.params[name]) {
						t.Fatalf("saved at %+v, resumed at %+v: rank %d %s %v, straight %v", save.at.pc, c.pc, r, name, v, straight.params[name])
					}
				}
				if biases == 0 {
					t.Fatalf("saved at %+v, resumed at %+v: rank %d holds no expert bias", save.at.pc, c.pc, r)
				}
			}
		}
	}
}
