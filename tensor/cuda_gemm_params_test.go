package tensor

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cuda"
)

// cublasHost computes what cublasGemmStridedBatchedEx computes for p
// (column-major, op(A) M×K, op(B) K×N, C M×N, strided batches) on host
// slices: the reference TestCUDAGemmParams holds Gemm's parameters to.
func cublasHost(p cuda.GemmParams, a, b, c []float32) {
	for bt := range max(p.Batch, 1) {
		oa, ob, oc := bt*int(p.StrideA), bt*int(p.StrideB), bt*int(p.StrideC)
		for j := range p.N {
			for i := range p.M {
				var sum float64
				for q := range p.K {
					ai := oa + i + q*p.LDA
					if p.TransA {
						ai = oa + q + i*p.LDA
					}
					bi := ob + q + j*p.LDB
					if p.TransB {
						bi = ob + j + q*p.LDB
					}
					sum += float64(a[ai]) * float64(b[bi])
				}
				ci := oc + i + j*p.LDC
				c[ci] = float32(float64(p.Alpha)*sum + float64(p.Beta)*float64(c[ci]))
			}
		}
	}
}

// TestCUDAGemmParams checks, without a GPU, the cuBLAS call the CUDA
// backend's Gemm makes: for Linear's three products (forward, dX, dW) and a
// batched product with a shared operand, the parameters — read by a host
// emulation of cublasGemmStridedBatchedEx's column-major contract — give
// the CPU's Gemm; bfloat16 operands under MatmulBF16 (gemm-bf16) are
// CUDA_R_16BF A and B with a float32 C and CUBLAS_COMPUTE_32F, float32
// ones CUBLAS_COMPUTE_32F_FAST_16BF; mixed operands are refused.
func TestCUDAGemmParams(t *testing.T) {
	rng := NewRNG(5)
	mk := func(shape ...int) *Tensor {
		x := Zeros(shape...)
		rng.Normal(x.Float32s(), 0, 1)
		for i, v := range x.Float32s() { // bfloat16 values: both sides exact
			x.Float32s()[i] = BFloat16ToFloat32(Float32ToBFloat16(v))
		}
		return x
	}
	const rows, in, out = 6, 5, 7
	for _, c := range []struct {
		name   string
		tA, tB Transpose
		a, b   []int
		c      []int
	}{
		{"forward x·wᵀ", NoTrans, Trans, []int{rows, in}, []int{out, in}, []int{rows, out}},
		{"dX g·w", NoTrans, NoTrans, []int{rows, out}, []int{out, in}, []int{rows, in}},
		{"dW gᵀ·x", Trans, NoTrans, []int{rows, out}, []int{rows, in}, []int{out, in}},
		{"batched, b shared", NoTrans, Trans, []int{3, rows, in}, []int{out, in}, []int{3, rows, out}},
	} {
		a, b, c0 := mk(c.a...), mk(c.b...), mk(c.c...)
		want := c0.Clone()
		cpuBackend{}.Gemm(MatmulFP32, c.tA, c.tB, 0.5, a, b, 2, want)
		for _, bf16 := range []bool{false, true} {
			ga, gb := a, b
			if bf16 {
				ga, gb = a.To(BFloat16), b.To(BFloat16)
			}
			p, ok := cudaGemmParams(MatmulBF16, c.tA, c.tB, 0.5, ga, gb, 2, c0)
			if !ok {
				t.Fatalf("%s: no call", c.name)
			}
			wantType, wantCompute := cuda.F32, cuda.Compute32FFast16BF
			if bf16 {
				wantType, wantCompute = cuda.BF16, cuda.Compute32F
			}
			if p.AType != wantType || p.BType != wantType || p.CType != cuda.F32 || p.Compute != wantCompute {
				t.Errorf("%s bf16 operands=%v: types %v·%v→%v compute %d, want %v·%v→f32 compute %d", c.name, bf16, p.AType, p.BType, p.CType, p.Compute, wantType, wantType, wantCompute)
			}
			got := c0.Clone()
			// A is b's storage, B is a's (Cᵀ = op(B)ᵀ·op(A)ᵀ)
			cublasHost(p, b.Float32s(), a.Float32s(), got.Float32s())
			for i, w := range want.Float32s() {
				if g := got.Float32s()[i]; math.Abs(float64(g-w)) > 1e-5*math.Max(1, math.Abs(float64(w))) {
					t.Fatalf("%s bf16 operands=%v: element %d: %v through the cuBLAS parameters, %v on the CPU", c.name, bf16, i, g, w)
				}
			}
		}
	}
	msg := mustPanic(func() { cudaGemmParams(MatmulBF16, NoTrans, Trans, 1, mk(2, 3).To(BFloat16), mk(4, 3), 0, Zeros(2, 4)) })
	if !strings.Contains(msg, "bfloat16 ones under bf16") {
		t.Errorf("mixed operands: panic %q", msg)
	}
	if _, ok := cudaGemmParams(MatmulFP32, NoTrans, NoTrans, 1, Zeros(0, 3), Zeros(3, 4), 0, Zeros(0, 4)); ok {
		t.Error("an empty product made a call")
	}
}
