package tensor

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cuda"
)

// Products through cuBLASLt (GOTRON_CUDA_UNVERIFIED naming cublaslt at
// OpenCUDA, or SetCUDALt): built, not yet run on a GPU. The CUDA backend's
// Gemm then calls cublasLtMatmul (internal/cuda's LtMatmul) with the same
// column-major parameters as cublasGemmStridedBatchedEx (cudaGemmParams),
// and Linear and LinearGELU fuse steps into their products through
// cuBLASLt's epilogues:
//
//   - forward with a bias: the BIAS epilogue adds the bias in the product
//     (x·wᵀ + b in one kernel instead of a GEMM and an add);
//   - LinearGELU (the MLP's fc1, its bias and the tanh GELU under the
//     bias-GELU fusion): one product with the GELU_AUX_BIAS epilogue,
//     which stores GELU(x·wᵀ + b) and, for the backward, x·wᵀ + b. Only
//     the tanh GELU: cuBLASLt's GELU is the tanh approximation (Megatron's
//     openai_gelu, gotron's gelu_tanh), not the erf GELU that is
//     Megatron's default. The backward's DGELU epilogue would belong to
//     fc2's dX product, another op's: the GELU's backward stays the
//     elementwise kernel;
//   - backward under MatmulFP32 with a bias: the dW product's BGRADB
//     epilogue sums the output gradient's rows into the bias gradient
//     (instead of SumRows' pass over the gradient), into a scratch vector
//     then added to the bias gradient (the epilogue writes, gradients
//     accumulate). Not under bf16/fp16: there the dW product reads the
//     output gradient rounded to 16 bits (a bfloat16 copy, or inside
//     cuBLAS), and the bias gradient is the float32 gradient's sum.
//
// A product cuBLASLt has no algorithm for runs as before (cuBLAS, then the
// separate add, GELU or SumRows), counted in LtCounts.Fallbacks.
//
// The simulated device takes the same branches (GemmBias, GemmBiasGELU,
// GemmBGrad) and runs each as the CPU's steps — the product, then Add,
// GELU or SumRows — so its numbers stay the CPU's bit for bit while the
// counts say the fused path was taken (TestSimLtEpiloguesMatchCPU).

// cudaLt turns the CUDA backend's cuBLASLt products on (SetCUDALt).
var cudaLt atomic.Bool

// SetCUDALt turns the CUDA backend's products through cuBLASLt on (or off)
// and returns the previous setting. OpenCUDA turns it on when
// GOTRON_CUDA_UNVERIFIED is 1 or names cublaslt (CUDAUnverified): it has
// not run on a GPU yet.
func SetCUDALt(on bool) bool { return cudaLt.Swap(on) }

// CUDALt reports whether the CUDA backend's products go through cuBLASLt.
func CUDALt() bool { return cudaLt.Load() }

// simLt turns the simulated device's epilogue branches on (the default).
var simLt atomic.Bool

func init() { simLt.Store(true) }

// SetSimLtEpilogues turns the simulated device's GemmBias and GemmBGrad
// branches on (the default, as the CUDA backend under cublaslt) or off,
// and returns the previous setting: tests compare the two paths.
func SetSimLtEpilogues(on bool) bool { return simLt.Swap(on) }

// LtCounts counts products through the epilogue branches since the process
// started, on every device (Sub gives a span's).
type LtCounts struct {
	// Products is cuBLASLt matmuls queued (the GPU only).
	Products int64
	// Bias, GELU and BGrad are Linear's products that fused the bias add,
	// the bias add and tanh GELU (LinearGELU), and the bias gradient (the
	// GPU's BIAS, GELU_AUX_BIAS and BGRADB epilogues, or the simulated
	// device's same branches).
	Bias, GELU, BGrad int64
	// Fallbacks is products cuBLASLt had no algorithm for, run through
	// cuBLAS (and the separate epilogue) instead.
	Fallbacks int64
}

// Sub returns c - d, field by field.
func (c LtCounts) Sub(d LtCounts) LtCounts {
	return LtCounts{Products: c.Products - d.Products, Bias: c.Bias - d.Bias, GELU: c.GELU - d.GELU, BGrad: c.BGrad - d.BGrad, Fallbacks: c.Fallbacks - d.Fallbacks}
}

func (c LtCounts) String() string {
	return fmt.Sprintf("%d cuBLASLt products, %d with the bias epilogue, %d with the bias and GELU epilogue, %d with the bias-gradient epilogue, %d fallbacks to cuBLAS", c.Products, c.Bias, c.GELU, c.BGrad, c.Fallbacks)
}

var ltCounts struct{ products, bias, gelu, bgrad, fallbacks atomic.Int64 }

// CUDALtCounts returns the process's counts so far.
func CUDALtCounts() LtCounts {
	return LtCounts{Products: ltCounts.products.Load(), Bias: ltCounts.bias.Load(), GELU: ltCounts.gelu.Load(), BGrad: ltCounts.bgrad.Load(), Fallbacks: ltCounts.fallbacks.Load()}
}

// epilogueGemmer is a backend that can fuse Linear's bias steps into its
// products. Each method returns false, having done nothing, when it cannot
// (the caller then runs the separate steps).
type epilogueGemmer interface {
	// GemmBias sets c = op(a)·op(b) + bias, bias (c's last dim) added to
	// every row.
	GemmBias(prec MatmulPrecision, tA, tB Transpose, a, b, bias, c *Tensor) bool
	// GemmBGrad adds op(a)·op(b) into c and the sums of op(a)'s rows (c's
	// rows: Σ_k op(a)[i, k]) into dbias; scratch holds as many float32s
	// as dbias, for the backend's use.
	GemmBGrad(prec MatmulPrecision, tA, tB Transpose, a, b, c, dbias, scratch *Tensor) bool
	// GemmBiasGELU sets pre = op(a)·op(b) + bias and act = GELUTanh(pre)
	// (pre and act of one shape).
	GemmBiasGELU(prec MatmulPrecision, tA, tB Transpose, a, b, bias, pre, act *Tensor) bool
}

// epiloguesOn returns be's epilogueGemmer when its fused branches are on.
func epiloguesOn(be Backend) (epilogueGemmer, bool) {
	switch be := be.(type) {
	case simBackend:
		return be, simLt.Load()
	case cudaBackend:
		return be, cudaLt.Load()
	}
	return nil, false
}

// countProduct counts a MatmulBF16 product for BF16GemmOperandCounts as
// gemm does.
func countProduct(prec MatmulPrecision, a, b *Tensor) {
	if prec != MatmulBF16 {
		return
	}
	n := int64(a.Numel() + b.Numel())
	if a.dtype == BFloat16 {
		bf16Counts.bf16Products.Add(1)
		bf16Counts.bf16Elems.Add(n)
	} else {
		bf16Counts.fp32Products.Add(1)
		bf16Counts.fp32Elems.Add(n)
	}
}

// biasFusable reports whether bias is a float32 vector of c's last dim
// that an epilogue can read in place.
func biasFusable(bias, c *Tensor) bool {
	return bias != nil && bias.dtype == Float32 && bias.IsContiguous() && bias.Numel() == c.Dim(-1) && c.dtype == Float32
}

// GemmBias on the simulated device: the CPU's product, then its add.
func (s simBackend) GemmBias(prec MatmulPrecision, tA, tB Transpose, a, b, bias, c *Tensor) bool {
	if !biasFusable(bias, c) {
		return false
	}
	s.Gemm(prec, tA, tB, 1, a, b, 0, c)
	s.Add(c, c, bias)
	ltCounts.bias.Add(1)
	return true
}

// GemmBiasGELU on the simulated device: the CPU's product, add and GELU
// (Add then GELU is BiasGELU bit for bit on the CPU).
func (s simBackend) GemmBiasGELU(prec MatmulPrecision, tA, tB Transpose, a, b, bias, pre, act *Tensor) bool {
	if !biasFusable(bias, pre) {
		return false
	}
	s.Gemm(prec, tA, tB, 1, a, b, 0, pre)
	s.Add(pre, pre, bias)
	s.GELUForward(act, pre, true)
	ltCounts.gelu.Add(1)
	return true
}

// GemmBGrad on the simulated device: the CPU's product, then SumRows of
// op(a) (a transposed: a's rows are op(a)'s columns).
func (s simBackend) GemmBGrad(prec MatmulPrecision, tA, tB Transpose, a, b, c, dbias, scratch *Tensor) bool {
	if !bgradFusable(prec, tA, a, c, dbias, scratch) {
		return false
	}
	s.Gemm(prec, tA, tB, 1, a, b, 1, c)
	s.SumRows(dbias, a)
	ltCounts.bgrad.Add(1)
	return true
}

// bgradFusable: the bias gradient of a float32 product (MatmulFP32) whose
// op(a) is a stored transposed (the dW product gᵀ·x), one matrix.
func bgradFusable(prec MatmulPrecision, tA Transpose, a, c, dbias, scratch *Tensor) bool {
	return prec == MatmulFP32 && tA == Trans && a.dtype == Float32 && len(a.shape) == 2 && len(c.shape) == 2 &&
		dbias != nil && dbias.dtype == Float32 && dbias.IsContiguous() && dbias.Numel() == c.Dim(0) &&
		scratch != nil && scratch.IsContiguous() && scratch.Numel() == dbias.Numel()
}

// cudaLtParams is the cuBLASLt call for Gemm's product (cudaGemmParams'
// parameters) with an epilogue, without device addresses: TestCUDALtParams
// checks it without a GPU.
func cudaLtParams(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, bm *Tensor, beta float32, c *Tensor, epi cuda.Epilogue) (cuda.LtParams, bool) {
	p, ok := cudaGemmParams(prec, tA, tB, alpha, a, bm, beta, c)
	if !ok {
		return cuda.LtParams{}, false
	}
	return cuda.LtParams{GemmParams: p, Epilogue: epi}, true
}

// cudaGELUParams is GemmBiasGELU's cuBLASLt call without addresses: D is
// act, Aux is pre at leading dimension M (pre's last dim, as D's).
func cudaGELUParams(prec MatmulPrecision, tA, tB Transpose, a, bm, pre, act *Tensor) (cuda.LtParams, bool) {
	p, ok := cudaLtParams(prec, tA, tB, 1, a, bm, 0, act, cuda.EpilogueGELUAuxBias)
	p.AuxLD = pre.Dim(-1)
	return p, ok
}

// ltRun queues p (addresses set) through cuBLASLt; false when cuBLASLt has
// no algorithm for it (counted), any other error panics as Gemm's do.
func (b cudaBackend) ltRun(name string, p cuda.LtParams) bool {
	var err error
	b.rt.timed(name, func() { err = b.rt.dev.LtMatmul(p) })
	if errors.Is(err, cuda.ErrLtNoAlgorithm) {
		ltCounts.fallbacks.Add(1)
		return false
	}
	if err != nil {
		panic(fmt.Sprintf("tensor: CUDA cuBLASLt %dx%dx%d (batch %d, epilogue %v): %v", p.N, p.M, p.K, p.Batch, p.Epilogue, err))
	}
	ltCounts.products.Add(1)
	return true
}

// ltGemm is Gemm through cuBLASLt (DEFAULT epilogue); false: not run.
func (b cudaBackend) ltGemm(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, bm *Tensor, beta float32, c *Tensor) bool {
	p, ok := cudaLtParams(prec, tA, tB, alpha, a, bm, beta, c, cuda.EpilogueDefault)
	if !ok {
		return true // an empty product: nothing to do
	}
	p.A, p.B, p.C = devPtr(bm), devPtr(a), devPtr(c)
	return b.ltRun("cublaslt gemm "+prec.String(), p)
}

// GemmBias on the GPU: one cuBLASLt product with the BIAS epilogue (the
// bias is one element per row of the column-major D, M = c's last dim).
func (b cudaBackend) GemmBias(prec MatmulPrecision, tA, tB Transpose, a, bm, bias, c *Tensor) bool {
	if !biasFusable(bias, c) {
		return false
	}
	p, ok := cudaLtParams(prec, tA, tB, 1, a, bm, 0, c, cuda.EpilogueBias)
	if !ok {
		return false
	}
	p.A, p.B, p.C, p.Bias = devPtr(bm), devPtr(a), devPtr(c), devPtr(bias)
	if !b.ltRun("cublaslt gemm+bias "+prec.String(), p) {
		return false
	}
	ltCounts.bias.Add(1)
	return true
}

// GemmBiasGELU on the GPU: one product with the GELU_AUX_BIAS epilogue,
// D = act, the GELU's input stored in Aux = pre (leading dimension M, which
// cuBLASLt wants a multiple of 8: other widths take the bias epilogue and
// the GELU kernel).
func (b cudaBackend) GemmBiasGELU(prec MatmulPrecision, tA, tB Transpose, a, bm, bias, pre, act *Tensor) bool {
	if !biasFusable(bias, pre) || pre.Dim(-1)%8 != 0 || !act.IsContiguous() || !SameShape(act.shape, pre.shape) {
		return false
	}
	p, ok := cudaGELUParams(prec, tA, tB, a, bm, pre, act)
	if !ok {
		return false
	}
	p.A, p.B, p.C, p.Bias, p.Aux = devPtr(bm), devPtr(a), devPtr(act), devPtr(bias), devPtr(pre)
	if !b.ltRun("cublaslt gemm+bias+gelu "+prec.String(), p) {
		return false
	}
	ltCounts.gelu.Add(1)
	return true
}

// GemmBGrad on the GPU: the product with the BGRADB epilogue (Σ over K of
// op(B), which is op(a) transposed: a's columns summed over its rows, N =
// c's rows elements) into scratch, then scratch added to dbias.
func (b cudaBackend) GemmBGrad(prec MatmulPrecision, tA, tB Transpose, a, bm, c, dbias, scratch *Tensor) bool {
	if !bgradFusable(prec, tA, a, c, dbias, scratch) {
		return false
	}
	p, ok := cudaLtParams(prec, tA, tB, 1, a, bm, 1, c, cuda.EpilogueBGradB)
	if !ok {
		return false
	}
	p.A, p.B, p.C, p.Bias = devPtr(bm), devPtr(a), devPtr(c), devPtr(scratch)
	if !b.ltRun("cublaslt gemm+bgradb "+prec.String(), p) {
		return false
	}
	b.Axpy(dbias, 1, scratch)
	ltCounts.bgrad.Add(1)
	return true
}
