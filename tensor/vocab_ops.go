package tensor

import "fmt"

// Vocab-parallel ops: the local arithmetic of Megatron's
// VocabParallelEmbedding and vocab_parallel_cross_entropy
// (megatron/core/tensor_parallel/layers.py and cross_entropy.py), where
// each tensor-parallel rank holds the vocabulary rows [start, start+v). The
// collectives between them (max, then sum, all-reduces) are the caller's:
// the row maxima and the (2, n) partials are the buffers it reduces. They
// are plain functions, not tape ops: package tp wraps them in its own
// autograd Functions around the collectives.

// mustVocab panics unless t is a contiguous tensor of dtype and shape (a
// programming error, like a shape mismatch in an op); nil t passes when
// optional is set.
func mustVocab(op, what string, t *Tensor, optional bool, dtype DType, shape ...int) {
	if t == nil {
		if optional {
			return
		}
		panic(fmt.Sprintf("tensor: %s: %s is nil", op, what))
	}
	if t.dtype != dtype || !t.IsContiguous() || len(t.shape) != len(shape) {
		panic(fmt.Sprintf("tensor: %s: %s is %v %v (contiguous=%v), want contiguous %v %v", op, what, t.dtype, t.shape, t.IsContiguous(), dtype, shape))
	}
	for i, d := range shape {
		if t.shape[i] != d {
			panic(fmt.Sprintf("tensor: %s: %s has shape %v, want %v", op, what, t.shape, shape))
		}
	}
}

// VocabEmbeddingForward overwrites out (n, h) with the rows of table (v, h),
// this rank's vocabulary rows [start, start+v), that the int32 ids (n)
// select: row i is table[ids[i]−start], or zeros when ids[i] is another
// rank's. Summed over the ranks, the outputs are the full embedding.
func VocabEmbeddingForward(out, table, ids *Tensor, start int) {
	n, h := ids.Numel(), table.Dim(-1)
	mustVocab("VocabEmbeddingForward", "table", table, false, Float32, table.Dim(0), h)
	mustVocab("VocabEmbeddingForward", "ids", ids, false, Int32, n)
	mustVocab("VocabEmbeddingForward", "out", out, false, Float32, n, h)
	backendFor(out, table, ids).VocabEmbeddingForward(out, table, ids, start)
}

// VocabEmbeddingBackward overwrites dtable (v, h), the gradient of this
// rank's rows [start, start+v), with the sums of the rows of dout (n, h)
// whose ids select them: row ids[i]−start gets row i, added in order of i
// (so repeated ids sum deterministically); rows no id selects are zero.
func VocabEmbeddingBackward(dtable, dout, ids *Tensor, start int) {
	n, h := ids.Numel(), dtable.Dim(-1)
	mustVocab("VocabEmbeddingBackward", "dtable", dtable, false, Float32, dtable.Dim(0), h)
	mustVocab("VocabEmbeddingBackward", "ids", ids, false, Int32, n)
	mustVocab("VocabEmbeddingBackward", "dout", dout, false, Float32, n, h)
	backendFor(dtable, dout, ids).VocabEmbeddingBackward(dtable, dout, ids, start)
}

// RowMax sets m[i] to the maximum of row i of x (n, v).
func RowMax(m, x *Tensor) {
	mustVocab("RowMax", "x", x, false, Float32, x.Dim(0), x.Dim(-1))
	mustVocab("RowMax", "m", m, false, Float32, x.Dim(0))
	backendFor(m, x).RowMax(m, x)
}

// VocabCrossEntropyPartials writes what each rank contributes to the
// cross-entropy of logits x (n, v), this rank's vocabulary slice [start,
// start+v), given the global row maxima rowMax (n) and the int32 targets
// (n): row 0 of partials (2, n) gets Σ_j exp(x[i,j] − rowMax[i]), row 1
// x[i, targets[i]−start] − rowMax[i] when the target is in the slice, else
// 0. Summed over the ranks, they are the sums of exponentials and the
// target logits (shifted by the max) of the full rows.
func VocabCrossEntropyPartials(partials, x, rowMax, targets *Tensor, start int) {
	n := x.Dim(0)
	mustVocab("VocabCrossEntropyPartials", "x", x, false, Float32, n, x.Dim(-1))
	mustVocab("VocabCrossEntropyPartials", "partials", partials, false, Float32, 2, n)
	mustVocab("VocabCrossEntropyPartials", "rowMax", rowMax, false, Float32, n)
	mustVocab("VocabCrossEntropyPartials", "targets", targets, false, Int32, n)
	backendFor(partials, x, rowMax, targets).VocabCrossEntropyPartials(partials, x, rowMax, targets, start)
}

// VocabCrossEntropyLoss finishes the cross-entropy from the summed partials
// (2, n) and the row maxima (n): it sets lse[i] = rowMax[i] + log(s_i)
// (computed in float64, rounded) for the backward pass, writes the weighted
// mean loss Σ w_i·(log s_i − t_i) / Σ w_i (float64 sums in row order; 0 when
// Σ w_i is not positive) into loss (1), and Σ w_i's float64 bits into den,
// an Int64 (1) tensor on the same device (not read back: the backward pass
// divides by it). The weights w are mask (n), or 1 when mask is nil.
func VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask *Tensor) {
	n := rowMax.Numel()
	mustVocab("VocabCrossEntropyLoss", "den", den, false, Int64, 1)
	mustVocab("VocabCrossEntropyLoss", "rowMax", rowMax, false, Float32, n)
	mustVocab("VocabCrossEntropyLoss", "partials", partials, false, Float32, 2, n)
	mustVocab("VocabCrossEntropyLoss", "lse", lse, false, Float32, n)
	mustVocab("VocabCrossEntropyLoss", "mask", mask, true, Float32, n)
	mustVocab("VocabCrossEntropyLoss", "loss", loss, false, Float32, 1)
	backendFor(loss, lse, den, partials, rowMax, mask).VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask)
}

// VocabCrossEntropyBackward overwrites dx (n, v), which may be x itself,
// with the gradient of the weighted mean loss with respect to this rank's
// logits x (n, v): scale_i·(exp(x[i,j] − lse[i]) − [j = targets[i]−start]),
// scale_i = dloss·w_i/den rounded in float32 (0 for every row when den is
// not positive), with lse and den from VocabCrossEntropyLoss, dloss (1) the
// loss's gradient and w mask (n) or 1 when mask is nil.
func VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den *Tensor, start int) {
	n, v := x.Dim(0), x.Dim(-1)
	mustVocab("VocabCrossEntropyBackward", "x", x, false, Float32, n, v)
	mustVocab("VocabCrossEntropyBackward", "dx", dx, false, Float32, n, v)
	mustVocab("VocabCrossEntropyBackward", "lse", lse, false, Float32, n)
	mustVocab("VocabCrossEntropyBackward", "targets", targets, false, Int32, n)
	mustVocab("VocabCrossEntropyBackward", "mask", mask, true, Float32, n)
	mustVocab("VocabCrossEntropyBackward", "dloss", dloss, false, Float32, 1)
	mustVocab("VocabCrossEntropyBackward", "den", den, false, Int64, 1)
	backendFor(dx, x, lse, targets, mask, dloss, den).VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den, start)
}
