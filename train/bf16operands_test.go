package train

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// simBF16Counts returns what fn did with products under --bf16, and fails
// unless every one of them read bfloat16 operands and the weights were
// cast at most once per iteration and rank (iters iterations, ranks
// ranks, each with at most linears weights a product reads).
func simBF16Counts(t *testing.T, what string, fn func()) tensor.BF16OperandCounts {
	t.Helper()
	before := tensor.BF16GemmOperandCounts()
	fn()
	d := tensor.BF16GemmOperandCounts().Sub(before)
	if d.BF16OperandProducts == 0 || d.FP32OperandProducts != 0 {
		t.Errorf("%s: %v: want every product on bfloat16 operands", what, d)
	}
	return d
}

// TestSimBF16GemmOperandsMatchCPU: --bf16 training on the simulated device,
// whose products read bfloat16 operands (the weights' bfloat16 copies,
// cast once a step; activations and gradients cast once), gives the CPU's
// --bf16 losses, validation loss and final parameters bit for bit (the
// CPU rounds the float32 operands inside its products, as before): one
// process with a save and a resume (the copies rebuilt from the loaded
// float32 parameters, on sim and on the CPU), DP=2 with the distributed
// optimizer and overlapped parameter gathers, TP=2 with sequence
// parallelism, CP=2 (p2p ring), PP=2 (1F1B with tied embeddings, and
// interleaved), and an MoE model.
func TestSimBF16GemmOperandsMatchCPU(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.BF16, cfg.TrainIters = true, 6
	want := runOn(t, cfg, tensor.CPU)
	var got deviceRun
	d := simBF16Counts(t, "one process", func() { got = runOn(t, cfg, tensor.Sim) })
	sameDeviceRun(t, "bf16 operands on sim", got, want)
	// 2 layers of 4 linear layers and the tied output layer: 9 weights,
	// cast once in each of 6 steps and for each of the evaluations.
	evals := int64(cfg.TrainIters/cfg.EvalInterval + 1)
	if d.WeightCasts > 9*(int64(cfg.TrainIters)+evals) || d.WeightCasts < 9*int64(cfg.TrainIters) {
		t.Errorf("one process: %d weight casts in %d iterations: want 9 a step (and 9 an evaluation)", d.WeightCasts, cfg.TrainIters)
	}
	if i := strings.Index(got.log, "bf16 GEMM operands: "); i < 0 {
		t.Errorf("the sim run's log has no bf16 GEMM operands line:\n%s", got.log)
	} else {
		t.Logf("%s", strings.TrimSpace(got.log[i:]))
	}

	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 3
	var a deviceRun
	simBF16Counts(t, "first half", func() { a = runOn(t, first, tensor.Sim) })
	for _, dev := range []tensor.Device{tensor.Sim, tensor.CPU} {
		second := cfg
		second.Load = dir
		b := runOn(t, second, dev)
		b.res.Losses = append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
		sameDeviceRun(t, "bf16 operands resumed on "+dev.String(), b, want)
	}

	// MoE: the router's and every expert's products (tensor.GroupedLinear's
	// loop of Linears, each expert's weight its own copy); the grouped
	// GEMM (--moe-grouped-gemm) keeps float32 operands
	moe := moeTrainConfig()
	moe.BF16, moe.TrainIters = true, 3
	moe.Model.MoE.GroupedGEMM = false
	wantMoE := runOn(t, moe, tensor.CPU)
	var gotMoE deviceRun
	simBF16Counts(t, "MoE", func() { gotMoE = runOn(t, moe, tensor.Sim) })
	sameDeviceRun(t, "MoE with bf16 operands on sim", gotMoE, wantMoE)

	train, valid := dpDataset(t, 16)
	models := dpModels()
	layout := func(name string, m gpt.Config, run func(Config) []dpRun) {
		c := dpConfig(m)
		c.BF16, c.MicroBatchSize, c.TrainIters = true, 1, 3
		w := run(c)
		sim := c
		sim.Device = tensor.Sim
		var g []dpRun
		simBF16Counts(t, name, func() { g = run(sim) })
		sameRunBits(t, name, w, g)
	}
	layout("DP=2 distributed optimizer", models["llama"], func(c Config) []dpRun {
		return runDP(t, c, 2, ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000, OverlapParamGather: true}, train, valid)
	})
	tpModel := models["gpt2"]
	tpModel.HiddenDropout, tpModel.AttentionDropout = 0.1, 0.1
	layout("TP=2 SP", tpModel, func(c Config) []dpRun {
		return runTP(t, c, 2, 1, true, ddp.Config{}, train, valid)
	})
	cpTrain, cpValid := dpDataset(t, 64)
	layout("CP=2 p2p", cpModels()["llama"], func(c Config) []dpRun {
		c.SeqLength, c.MicroBatchSize = 64, 2
		rs := runCPLayout(t, c, cpLayout{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.P2P}, cpTrain, cpValid)
		for i := range rs { // runCPLayout does not record it
			rs[i].device = c.Device
		}
		return rs
	})
	ppModel := models["gpt2"]
	ppModel.NumLayers = 4
	for _, l := range []ppLayout{
		{tp: 1, pp: 2, dp: 1},
		{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{VPP: 2}},
	} {
		l.split.PP = l.pp
		layout(fmt.Sprint(l), ppModel, func(c Config) []dpRun {
			c.MicroBatchSize = 2
			return runPP(t, c, l, train, valid)
		})
	}
}
