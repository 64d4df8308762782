package backendtest

import (
	"math"
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
