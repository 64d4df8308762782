package tensor

import (
	"math"
	"runtime"
)

// The CUDA backend's reductions, softmax, dropout masks and loss-mask
// bookkeeping: internal/cuda/kernels' reduce.cu and dropout.cu. Row
// kernels run one block per row (rows grid-strided over at most
// cudaRowBlocks blocks); sums are float32 (float64 where the CPU's are)
// but in a tree order, so they match the CPU's within rounding, not bit
// for bit. Maxima, argmaxima and dropout masks are exact.

// cudaRowBlocks caps the blocks of a row kernel: enough to fill a GPU
// (132 SMs × 32 resident blocks on an H100) with rows left to loop over.
const cudaRowBlocks = 8192

// cudaRowThreads is the block size for rows of c elements: c rounded up
// to a warp, between one warp and 256 threads.
func cudaRowThreads(c int) int { return min(256, max(32, (c+31)/32*32)) }

// launchRows runs a one-block-per-row kernel over n rows of c elements.
func (be cudaBackend) launchRows(kernel string, n, c int, args ...any) {
	if n <= 0 {
		return
	}
	be.launch(kernel, [3]int{min(n, cudaRowBlocks), 1, 1}, [3]int{cudaRowThreads(c), 1, 1}, 0, args...)
}

// SumRows adds x's column sums into out in two passes: chunks of rows
// summed per column into a scratch (chunks, c), then the chunks in order
// into out, so the result does not depend on scheduling.
func (be cudaBackend) SumRows(out, x *Tensor) {
	n, c := rowsCols(x)
	if n == 0 || c == 0 {
		return
	}
	colBlocks := (c + 31) / 32
	chunks := min(max(1, 2048/colBlocks), (n+63)/64)
	rowsPerChunk := (n + chunks - 1) / chunks
	chunks = (n + rowsPerChunk - 1) / rowsPerChunk
	partial := be.empty(Float32, chunks, c)
	be.launch("reduce_sumrows_partial_f32", [3]int{colBlocks, chunks, 1}, [3]int{32, 8, 1}, 0,
		be.ptr(partial), be.ptr(x), int64(n), int64(c), int64(rowsPerChunk))
	be.launch1D("reduce_sumrows_final_f32", c, be.ptr(out), be.ptr(partial), int64(chunks), int64(c))
	runtime.KeepAlive(partial)
}

// SumAll sums in float64: per-block partial sums into a scratch of
// float64s (int64 storage), then one block adds them and rounds once.
func (be cudaBackend) SumAll(out, x *Tensor) {
	n := x.Numel()
	blocks := max(1, min(1024, (n+1023)/1024))
	partial := be.empty(Int64, blocks) // float64 bits
	be.launch("reduce_sumall_partial_f32", [3]int{blocks, 1, 1}, [3]int{256, 1, 1}, 0, be.ptr(partial), be.ptr(x), int64(n))
	be.launch("reduce_sumall_final_f32", [3]int{1, 1, 1}, [3]int{256, 1, 1}, 0, be.ptr(out), be.ptr(partial), int32(blocks))
	runtime.KeepAlive(partial)
}

func (be cudaBackend) RowSum(out, x *Tensor) {
	n, c := rowsCols(x)
	be.launchRows("reduce_rowsum_f32", n, c, be.ptr(out), be.ptr(x), int64(n), int64(c))
}

func (be cudaBackend) RowArgMax(out, arg, x *Tensor) {
	n, c := rowsCols(x)
	be.launchRows("reduce_rowargmax_f32", n, c, be.ptr(out), be.ptr(arg), be.ptr(x), int64(n), int64(c))
}

// RowMax takes rows and columns as the CPU does (x.Dim(0), x.Dim(-1)): a
// row of no columns gets -Inf.
func (be cudaBackend) RowMax(m, x *Tensor) {
	n, c := x.Dim(0), x.Dim(-1)
	be.launchRows("reduce_rowmax_f32", n, c, be.ptr(m), be.ptr(x), int64(n), int64(c))
}

func (be cudaBackend) SoftmaxForward(out, x *Tensor) {
	n, c := rowsCols(x)
	be.launchRows("reduce_softmax_fwd_f32", n, c, be.ptr(out), be.ptr(x), int64(n), int64(c))
}

func (be cudaBackend) SoftmaxBackward(dx, dout, out *Tensor) {
	n, c := rowsCols(out)
	be.launchRows("reduce_softmax_bwd_f32", n, c, be.ptr(dx), be.ptr(dout), be.ptr(out), int64(n), int64(c))
}

// DropoutMask draws tensor.RNG's Philox stream on the device: the
// threshold and keep scale are computed here exactly as RNG.DropoutMask
// computes them, so the mask is the CPU's bit for bit.
func (be cudaBackend) DropoutMask(mask *Tensor, p float32, rng RNGState) {
	n := mask.Numel()
	keep := 1 / (1 - p)
	thr := uint32(float64(p) * (1 << 32))
	if p >= 1 {
		be.Fill(mask, 0)
		return
	}
	be.launch1D("dropout_mask_f32", (n+3)/4, be.ptr(mask), int64(n), rng.Key[0], rng.Key[1], rng.Offset, thr, keep)
}

// LossMaskMean runs in one block (a few thousand to a million rows:
// bandwidth-trivial) and leaves Σ w in den (float64 bits) on the device.
func (be cudaBackend) LossMaskMean(out, w, den, losses, mask *Tensor) {
	n := w.Numel()
	be.launch("reduce_loss_mask_mean_f32", [3]int{1, 1, 1}, [3]int{1024, 1, 1}, 0,
		be.ptr(out), be.ptr(den), be.ptr(w), be.ptr(losses), be.ptr(mask), int64(n))
}

// lossMaskScaleDevArgs are reduce_loss_mask_scale_dev_f32's arguments
// (TestLossMaskScaleDevArgsMatchPTX checks them against the PTX).
func lossMaskScaleDevArgs(w, dout, den uintptr, n int) []any {
	return []any{w, dout, den, int64(n)}
}

// LossMaskScale reads dout[0] on the device. den is read there too under
// GOTRON_CUDA_UNVERIFIED=fewer-syncs (reduce_loss_mask_scale_dev_f32,
// built, not yet run on a GPU); otherwise it comes back to the host (a
// synchronizing read per micro-batch) and goes in as the float32 the CPU
// divides by.
func (be cudaBackend) LossMaskScale(w, dout, den *Tensor) {
	n := w.Numel()
	if be.rt.fewerSyncs {
		be.launch1D("reduce_loss_mask_scale_dev_f32", n, lossMaskScaleDevArgs(be.ptr(w), be.ptr(dout), be.ptr(den), n)...)
		return
	}
	dh := math.Float64frombits(uint64(fromCUDA(den, CPU, siteLossMaskDen).Int64s()[0]))
	positive, d := int32(0), float32(1)
	if dh > 0 {
		positive, d = 1, float32(dh)
	}
	be.launch1D("reduce_loss_mask_scale_f32", n, be.ptr(w), be.ptr(dout), d, positive, int64(n))
}
