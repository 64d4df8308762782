package tp

import (
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// VocabEmbedding is the lookup half of Megatron's VocabParallelEmbedding:
// this rank holds rows [start, start+V/TP) of the word embedding (table);
// tokens outside them give zero rows. The result (b, t, h) is a partial sum
// that the caller reduces (ReduceFrom, or ReduceScatterSeq with sequence
// parallelism).
func (r *Region) VocabEmbedding(tp *tensor.Tape, tokens, table *tensor.Tensor, start int) *tensor.Tensor {
	ids := tokens.Contiguous().Reshape(-1)
	vl, h := table.Dim(0), table.Dim(1)
	shape := append(append([]int(nil), tokens.Shape()...), h)
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			out := tp.EmptyLike(in[0], shape...)
			tensor.VocabEmbeddingForward(out.Reshape(-1, h), in[0], ids, start)
			return []*tensor.Tensor{out}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			d := tp.EmptyLike(table, vl, h)
			tensor.VocabEmbeddingBackward(d, g[0].Contiguous().Reshape(-1, h), ids, start)
			return []*tensor.Tensor{d}
		},
	}, table)[0]
}

// VocabCrossEntropy is Megatron's vocab_parallel_cross_entropy
// (megatron/core/tensor_parallel/cross_entropy.py)
// with the token-weighted mean of pretrain_gpt.py's loss: logits (n, V/TP)
// hold this rank's vocabulary slice [start, start+V/TP); the row max, the sum
// of exponentials and the target logit are all-reduced, so no rank ever holds
// the full logits. mask (n) may be nil (every token weighs 1). It returns the
// scalar Σ mask·loss / Σ mask, the same on every rank.
func (r *Region) VocabCrossEntropy(tp *tensor.Tape, logits, targets, mask *tensor.Tensor, start int) *tensor.Tensor {
	n := logits.Dim(0)
	tg := targets.Contiguous().Reshape(n)
	var mk *tensor.Tensor
	if mask != nil {
		mk = mask.Contiguous().Reshape(n)
	}
	// Saved for backward: each row's global log-sum-exp and Σ mask.
	lse := tensor.ZerosOn(logits.Device(), n)
	den := tensor.NewOn(logits.Device(), tensor.Int64, 1) // float64 bits, left on the device
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			x := in[0].Contiguous()
			rowMax := tensor.ZerosOn(x.Device(), n)
			tensor.RowMax(rowMax, x)
			r.allReduce(tp, "vocab cross-entropy max all_reduce", rowMax, comm.Max)
			// One all-reduce carries the sums of exponentials and the
			// target logits (shifted by the max).
			partials := tensor.ZerosOn(x.Device(), 2, n)
			tensor.VocabCrossEntropyPartials(partials, x, rowMax, tg, start)
			r.allReduce(tp, "vocab cross-entropy sum all_reduce", partials, comm.Sum)
			out := tp.EmptyLike(x, 1)
			tensor.VocabCrossEntropyLoss(out, lse, den, partials, rowMax, mk)
			return []*tensor.Tensor{out}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			d := tp.EmptyLike(logits, n, logits.Dim(1))
			tensor.VocabCrossEntropyBackward(d, logits.Contiguous(), lse, tg, mk, g[0].Contiguous().Reshape(1), den, start)
			return []*tensor.Tensor{d}
		},
	}, logits)[0]
}
