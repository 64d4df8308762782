package tensor

import (
	"math"
	"runtime"
)

// The CUDA backend's cross-entropy: internal/cuda/kernels' xent.cu, after
// internal/cpu's crossentropy.go and vocabce.go. One block per row; sums
// of exponentials are float32 in a tree order (within rounding of the
// CPU's), the vocab-parallel loss's float64 sums run in row order on one
// thread (as the CPU's). A target the CPU would panic on (outside [0, V)
// and not the ignore index) makes its row's loss and gradient NaN instead:
// checking it here would read the targets back every step.

// xentRowThreads is the block size for rows of v logits: about eight
// logits a thread, a whole number of warps between 1 and 32.
func xentRowThreads(v int) int { return min(1024, max(32, ((v+7)/8+31)/32*32)) }

// launchXentRows runs a one-block-per-row kernel over n rows of v logits.
func (be cudaBackend) launchXentRows(kernel string, n, v int, args ...any) {
	if n <= 0 || v <= 0 {
		return
	}
	be.launch(kernel, [3]int{min(n, normRowBlocks), 1, 1}, [3]int{xentRowThreads(v), 1, 1}, 0, args...)
}

func (be cudaBackend) CrossEntropyForward(losses, lse, logits, targets *Tensor, cfg CrossEntropyConfig) {
	be.launchXentRows("xent_fwd_f32", cfg.N, cfg.V, be.ptr(losses), be.ptr(lse), be.ptr(logits), be.ptr(targets),
		int64(cfg.N), int64(cfg.V), cfg.LabelSmoothing, cfg.IgnoreIndex)
}

func (be cudaBackend) CrossEntropyBackward(dlogits, logits, lse, targets, dlosses *Tensor, cfg CrossEntropyConfig) {
	be.launchXentRows("xent_bwd_f32", cfg.N, cfg.V, be.ptr(dlogits), be.ptr(logits), be.ptr(lse), be.ptr(targets),
		be.ptr(dlosses), int64(cfg.N), int64(cfg.V), cfg.LabelSmoothing, cfg.IgnoreIndex)
}

func (be cudaBackend) VocabCrossEntropyPartials(partials, x, rowMax, targets *Tensor, start int) {
	n, vl := x.Dim(0), x.Dim(-1)
	if vl == 0 { // no logits: the sums are 0, no target is in the slice
		be.Fill(partials, 0)
		return
	}
	be.launchXentRows("xent_vocab_partials_f32", n, vl, be.ptr(partials), be.ptr(x), be.ptr(rowMax), be.ptr(targets),
		int64(n), int64(vl), int64(start))
}

// VocabCrossEntropyLoss computes each row's log-sum-exp and weighted loss
// term in parallel, then sums the terms and weights in row order on one
// thread and reads Σ w back (8 bytes).
func (be cudaBackend) VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask *Tensor) {
	n := rowMax.Numel()
	term := be.empty(Int64, max(n, 1)) // float64 bits
	be.launch1D("xent_vocab_loss_rows_f32", n, be.ptr(term), be.ptr(lse), be.ptr(partials), be.ptr(rowMax), be.ptr(mask), int64(n))
	be.launch("xent_vocab_loss_final_f32", [3]int{1, 1, 1}, [3]int{256, 1, 1}, 0,
		be.ptr(loss), be.ptr(den), be.ptr(term), be.ptr(mask), int64(n))
	runtime.KeepAlive(term)
}

// xentVocabBwdDevArgs are xent_vocab_bwd_dev_f32's arguments
// (TestXentVocabBwdDevArgsMatchPTX checks them against the PTX).
func xentVocabBwdDevArgs(dx, x, lse, targets, mask, dloss, den uintptr, n, vl, start int) []any {
	return []any{dx, x, lse, targets, mask, dloss, int64(n), int64(vl), int64(start), den}
}

// VocabCrossEntropyBackward reads dloss on the device. den is read there
// too under GOTRON_CUDA_UNVERIFIED=fewer-syncs (xent_vocab_bwd_dev_f32,
// built, not yet run on a GPU); otherwise it comes back to the host (a
// synchronizing read per micro-batch) as the float32 the CPU divides by.
func (be cudaBackend) VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den *Tensor, start int) {
	n, vl := x.Dim(0), x.Dim(-1)
	if be.rt.fewerSyncs {
		be.launchXentRows("xent_vocab_bwd_dev_f32", n, vl, xentVocabBwdDevArgs(be.ptr(dx), be.ptr(x), be.ptr(lse), be.ptr(targets),
			be.ptr(mask), be.ptr(dloss), be.ptr(den), n, vl, start)...)
		return
	}
	dh := math.Float64frombits(uint64(fromCUDA(den, CPU, siteVocabCEDen).Int64s()[0]))
	positive, d := int32(0), float32(1)
	if dh > 0 {
		positive, d = 1, float32(dh)
	}
	be.launchXentRows("xent_vocab_bwd_f32", n, vl, be.ptr(dx), be.ptr(x), be.ptr(lse), be.ptr(targets), be.ptr(mask),
		be.ptr(dloss), int64(n), int64(vl), int64(start), d, positive)
}
