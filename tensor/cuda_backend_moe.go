package tensor

import (
	"fmt"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cuda"
)

// cudaGroupedGemm turns on GroupedLinear's one cublasGemmGroupedBatchedEx
// call per product on the GPU (SetCUDAGroupedGemm); off, the experts run as
// a loop of cuBLAS products.
var cudaGroupedGemm atomic.Bool

// SetCUDAGroupedGemm turns on (or off) the CUDA backend's grouped GEMM for
// the MoE experts (GroupedLinear under --moe-grouped-gemm: one
// cublasGemmGroupedBatchedEx call per product, where the loaded cuBLAS has
// it, 12.5 or later, and the products are float32; otherwise the loop), and
// returns the previous setting. It is off by default, and OpenCUDA turns it
// on when GOTRON_CUDA_UNVERIFIED is 1 or names moe-grouped
// (CUDAUnverified): it is built but has not yet run on a GPU.
func SetCUDAGroupedGemm(on bool) bool { return cudaGroupedGemm.Swap(on) }

// CUDAGroupedGemms is the number of grouped GEMM calls the CUDA backend has
// made (each one cublasGemmGroupedBatchedEx for all of a product's
// experts): a test's evidence that the grouped path ran.
func CUDAGroupedGemms() int64 {
	rt := cudaOpen.rt.Load()
	if rt == nil {
		return 0
	}
	return rt.groupedGemms.Load()
}

// groupedGemm runs c_i += op(a_i)·op(b_i) as one cuBLAS grouped call, each
// row-major product swapped to column-major as Gemm does (Cᵀ =
// op(B)ᵀ·op(A)ᵀ). It reports false, doing nothing, when the grouped GEMM is
// off or the loaded cuBLAS lacks it, for operands that are not float32,
// and for bf16/fp16 products: their
// compute types (CUBLAS_COMPUTE_32F_FAST_16BF/_16F) are not among those
// cublasGemmGroupedBatchedEx takes.
func (b cudaBackend) groupedGemm(prec MatmulPrecision, tA, tB Transpose, a, bm, c []*Tensor) bool {
	if !cudaGroupedGemm.Load() || !b.rt.dev.HasGroupedGemm() || prec != MatmulFP32 {
		return false
	}
	for i := range c {
		for _, t := range []*Tensor{a[i], bm[i], c[i]} {
			if t.dtype != Float32 {
				return false // the loop's Gemm decides what to do with it
			}
		}
	}
	groups := make([]cuda.GemmGroup, 0, len(c))
	for i := range c {
		m, n := c[i].Dim(0), c[i].Dim(1)
		k := a[i].Dim(1)
		if tA == Trans {
			k = a[i].Dim(0)
		}
		if m == 0 || n == 0 || k == 0 {
			continue // nothing to add (the loop skips these too)
		}
		groups = append(groups, cuda.GemmGroup{
			TransA: tB == Trans, TransB: tA == Trans,
			M: n, N: m, K: k, Alpha: 1, Beta: 1,
			A: devPtr(bm[i]), LDA: bm[i].Dim(1),
			B: devPtr(a[i]), LDB: a[i].Dim(1),
			C: devPtr(c[i]), LDC: n,
		})
	}
	if len(groups) == 0 {
		return true
	}
	b.rt.timed("cublas grouped gemm", func() {
		if err := b.rt.dev.GemmGrouped(cuda.F32, cuda.Compute32F, groups); err != nil {
			panic(fmt.Sprintf("tensor: CUDA grouped GEMM of %d experts: %v", len(groups), err))
		}
	})
	b.rt.groupedGemms.Add(1)
	// GemmGrouped uploaded the three device-pointer arrays first, a copy
	// that waits for the stream: counted as every host copy is.
	b.rt.copies.count("tensor.GroupedLinear (grouped GEMM's pointer arrays)", false, int64(3*8*len(groups)))
	return true
}
