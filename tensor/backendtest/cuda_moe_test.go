package backendtest

import (
	"math"
	"slices"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestCUDAGroupedLinearMatchesCPU: with the CUDA grouped GEMM on
// (GOTRON_CUDA_UNVERIFIED=moe-grouped), GroupedLinear over ragged experts
// (one empty, one of a single row) gives the CPU's output and gradients
// within 2e-4, in one cublasGemmGroupedBatchedEx call per product (forward,
// data and weight gradients); under bf16 products it falls back to the
// loop. It needs a GPU and cuBLAS 12.5 or later; built, not yet run on a
// GPU (tools/gpu/check.sh unverified).
func TestCUDAGroupedLinearMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if !tensor.CUDADevice().HasGroupedGemm() {
		v, path := tensor.CUDADevice().BLASVersion()
		t.Skipf("cuBLAS %d (%s) has no cublasGemmGroupedBatchedEx", v, path)
	}
	defer tensor.SetCUDAGroupedGemm(tensor.SetCUDAGroupedGemm(true))
	counts := []int{170, 0, 1, 129}
	run := func(dev tensor.Device, prec tensor.MatmulPrecision) (out []float32, grads [][]float32) {
		rng := tensor.NewRNG(6)
		x := param(rng, "x", 300, 32)
		var ws []*tensor.Tensor
		for i := range counts {
			ws = append(ws, param(rng, "w"+string(rune('0'+i)), 48, 32))
		}
		tensor.MoveParams(dev, append([]*tensor.Tensor{x}, ws...)...)
		tp := tensor.NewTape()
		tp.SetMatmulPrecision(prec)
		y := tp.GroupedLinear(x, ws, counts, true)
		if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
			t.Fatal(err)
		}
		out = tensor.ToHost(y).Float32s()
		for _, p := range append([]*tensor.Tensor{x}, ws...) {
			if p.Grad == nil {
				grads = append(grads, nil)
				continue
			}
			grads = append(grads, tensor.ToHost(p.Grad).Float32s())
		}
		return out, grads
	}
	closeTo := func(what string, got, want []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d values on the GPU, %d on the tensor.CPU", what, len(got), len(want))
		}
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 2e-4*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%s[%d]: GPU %g, tensor.CPU %g", what, i, got[i], want[i])
			}
		}
	}
	wantY, wantG := run(tensor.CPU, tensor.MatmulFP32)
	before := tensor.CUDAGroupedGemms()
	gotY, gotG := run(tensor.CUDA, tensor.MatmulFP32)
	if n := tensor.CUDAGroupedGemms() - before; n != 3 {
		t.Errorf("%d grouped GEMM calls, want 3 (forward, data and weight gradients)", n)
	}
	closeTo("y", gotY, wantY)
	for i := range wantG {
		closeTo("gradient "+string(rune('0'+i)), gotG[i], wantG[i])
	}
	before = tensor.CUDAGroupedGemms()
	run(tensor.CUDA, tensor.MatmulBF16)
	if n := tensor.CUDAGroupedGemms() - before; n != 0 {
		t.Errorf("bf16 products: %d grouped GEMM calls, want the loop (cuBLAS's grouped GEMM has no FAST_16BF compute type)", n)
	}
}

// param is a parameter of the given shape with standard normal values.
func param(rng *tensor.RNG, name string, shape ...int) *tensor.Tensor {
	p := tensor.Param(name, shape...)
	rng.Normal(p.Float32s(), 0, 1)
	return p
}

// TestCUDARouterMatchesCPU: with the MoE router's kernels on
// (GOTRON_CUDA_UNVERIFIED=moe-router), Route on the GPU chooses the CPU's
// experts and gives its probabilities and the logits' gradient bit for
// bit (moe.cu: the CPU's float64 operations, no fused multiply-adds), for
// softmax after and before the top-k, sigmoid with the expert bias, group
// limits and scaling, softmax and sigmoid with load-balancing losses (their
// values within float64 rounding, the gradient at a loss scale bit for
// bit), softmax and sigmoid with the z-loss (its value bit for bit), with
// and without load-balancing losses, on logits with ties, and builds the
// permutation of the routed tokens on the device (PermutationOn: the CPU's
// rows, probability indices and counts exactly); route and permutation
// read back only the experts' token counts and the losses' statistics (one
// copy to the host, its bytes counted) and upload nothing but the expert
// bias. Built, not yet run on a GPU
// (tools/gpu/check.sh unverified).
func TestCUDARouterMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	defer tensor.SetCUDARouter(tensor.SetCUDARouter(true))
	bias := make([]float32, 16)
	tensor.NewRNG(8).Normal(bias, 0, 0.1)
	for _, c := range []struct {
		name string
		cfg  tensor.RouterConfig
		ties bool
	}{
		{"softmax-topk-ties", tensor.RouterConfig{Experts: 8, TopK: 2}, true},
		{"pre-softmax-scaled", tensor.RouterConfig{Experts: 16, TopK: 4, PreSoftmax: true, ScalingFactor: 2.5}, false},
		{"sigmoid-bias-groups", tensor.RouterConfig{Experts: 16, TopK: 4, Score: tensor.ScoreSigmoid, NumGroups: 4, GroupTopK: 2, ExpertBias: bias}, true},
		{"softmax-losses", tensor.RouterConfig{Experts: 8, TopK: 2, Losses: true, Batch: 5, SeqLen: 103,
			Balancing: []tensor.LoadBalancing{{Coeff: 0.01}, {Seq: true, Coeff: 0.02}}}, true},
		{"sigmoid-losses", tensor.RouterConfig{Experts: 16, TopK: 4, Score: tensor.ScoreSigmoid, Losses: true, Batch: 5, SeqLen: 103,
			Balancing: []tensor.LoadBalancing{{Coeff: 0.01}, {Global: true, Coeff: 0.03}}}, false},
		{"softmax-losses-z", tensor.RouterConfig{Experts: 8, TopK: 2, Losses: true, Batch: 5, SeqLen: 103, ZLossCoeff: 1e-3,
			Balancing: []tensor.LoadBalancing{{Coeff: 0.01}, {Seq: true, Coeff: 0.02}}}, true},
		{"sigmoid-z-only", tensor.RouterConfig{Experts: 16, TopK: 4, Score: tensor.ScoreSigmoid, Losses: true, Batch: 5, SeqLen: 103, ZLossCoeff: 0.3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			const T = 515
			E := c.cfg.Experts
			type result struct {
				probs, dl  []float32
				m          []bool
				rows, flat []int32
				counts     []int
				copies     tensor.Transfers // Route and PermutationOn's
				auxes      []float64
				z          float64
			}
			run := func(dev tensor.Device) (res result) {
				rng := tensor.NewRNG(4)
				logits := param(rng, "logits", T, E)
				if c.ties {
					for i, v := range logits.Float32s() {
						logits.Float32s()[i] = float32(math.Round(float64(v) * 2))
					}
				}
				g := tensor.New(tensor.Float32, T, E)
				rng.Normal(g.Float32s(), 0, 1)
				tensor.MoveParams(dev, logits)
				cfg := c.cfg
				tp := tensor.NewTape()
				before := tensor.CUDATransfers()
				p, r := tp.Route(logits, &cfg)
				rows, flat, counts := r.PermutationOn(dev)
				res.copies = tensor.CUDATransfers().Sub(before)
				res.rows, res.flat, res.counts = tensor.ToHost(rows).Int32s(), tensor.ToHost(flat).Int32s(), counts
				r.AuxScale = 0.75
				res.auxes, res.z = r.Aux()
				if err := tp.BackwardFrom([]*tensor.Tensor{p}, []*tensor.Tensor{g.ToDevice(dev)}); err != nil {
					t.Fatal(err)
				}
				for tok := range T {
					for e := range E {
						res.m = append(res.m, r.Map(tok, e))
					}
				}
				res.probs, res.dl = tensor.ToHost(p).Float32s(), tensor.ToHost(logits.Grad).Float32s()
				return res
			}
			w, g := run(tensor.CPU), run(tensor.CUDA)
			if math.Float64bits(g.z) != math.Float64bits(w.z) || (w.z != 0) != (c.cfg.ZLossCoeff != 0) {
				t.Errorf("z-loss %v on the GPU, %v on the CPU", g.z, w.z)
			}
			for i := range w.auxes {
				if d := math.Abs(g.auxes[i] - w.auxes[i]); d > 1e-12*math.Abs(w.auxes[i]) {
					t.Errorf("loss %d = %v on the GPU, %v on the CPU", i, g.auxes[i], w.auxes[i])
				}
			}
			for i := range w.m {
				if g.m[i] != w.m[i] {
					t.Fatalf("token %d expert %d: chosen %v on the GPU, %v on the CPU", i/E, i%E, g.m[i], w.m[i])
				}
			}
			if !slices.Equal(g.counts, w.counts) || !slices.Equal(g.rows, w.rows) || !slices.Equal(g.flat, w.flat) {
				t.Fatalf("the GPU's permutation (counts %v) differs from the CPU's (counts %v)", g.counts, w.counts)
			}
			for what, pair := range map[string][2][]float32{"probabilities": {g.probs, w.probs}, "logits' gradient": {g.dl, w.dl}} {
				for i := range pair[1] {
					if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
						t.Fatalf("%s[%d] = %v on the GPU, %v on the CPU", what, i, pair[0][i], pair[1][i])
					}
				}
			}
			// one read-back: the token counts (E int32) and with losses
			// the sums and z sum (float64) and the aux counts (int32)
			wantBytes := int64(4 * E)
			if c.cfg.Losses {
				wantBytes += int64(8*c.cfg.Batch*E + 8 + 4*c.cfg.Batch*E)
			}
			wantIn := int64(0)
			if c.cfg.ExpertBias != nil {
				wantIn = 1 // the bias
			}
			if got := g.copies; got.ToHost != 1 || got.ToHostBytes != wantBytes || got.FromHost != wantIn {
				t.Errorf("the GPU's route and permutation copied %d times (%d bytes) to the host and %d from it, want 1 (%d bytes: the counts, with the losses' statistics) and %d",
					got.ToHost, got.ToHostBytes, got.FromHost, wantBytes, wantIn)
			}
		})
	}
}
