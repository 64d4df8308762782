package tp

import (
	"math"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
)

// VocabEmbedding is the lookup half of Megatron's VocabParallelEmbedding:
// this rank holds rows [start, start+V/TP) of the word embedding (table);
// tokens outside them give zero rows. The result (b, t, h) is a partial sum
// that the caller reduces (ReduceFrom, or ReduceScatterSeq with sequence
// parallelism).
func (r *Region) VocabEmbedding(tp *tensor.Tape, tokens, table *tensor.Tensor, start int) *tensor.Tensor {
	ids := tokens.Contiguous().Int32s()
	vl, h := table.Dim(0), table.Dim(1)
	shape := append(append([]int(nil), tokens.Shape()...), h)
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			out := tp.Empty(shape...)
			dst, w := out.Float32s(), in[0].Float32s()
			clear(dst)
			for i, id := range ids {
				if j := int(id) - start; j >= 0 && j < vl {
					copy(dst[i*h:(i+1)*h], w[j*h:(j+1)*h])
				}
			}
			return []*tensor.Tensor{out}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			d := tp.Empty(vl, h)
			dw, gs := d.Float32s(), g[0].Contiguous().Float32s()
			clear(dw)
			for i, id := range ids {
				if j := int(id) - start; j >= 0 && j < vl {
					row := dw[j*h : (j+1)*h]
					for k, v := range gs[i*h : (i+1)*h] {
						row[k] += v
					}
				}
			}
			return []*tensor.Tensor{d}
		},
	}, table)[0]
}

// VocabCrossEntropy is Megatron's vocab_parallel_cross_entropy (spec §2.3)
// with the token-weighted mean of pretrain_gpt.py's loss: logits (n, V/TP)
// hold this rank's vocabulary slice [start, start+V/TP); the row max, the sum
// of exponentials and the target logit are all-reduced, so no rank ever holds
// the full logits. mask (n) may be nil (every token weighs 1). It returns the
// scalar Σ mask·loss / Σ mask, the same on every rank.
func (r *Region) VocabCrossEntropy(tp *tensor.Tape, logits, targets, mask *tensor.Tensor, start int) *tensor.Tensor {
	n, vl := logits.Dim(0), logits.Dim(1)
	tg := targets.Contiguous().Int32s()
	var mk []float32
	if mask != nil {
		mk = mask.Contiguous().Float32s()
	}
	weight := func(i int) float32 {
		if mk == nil {
			return 1
		}
		return mk[i]
	}
	// Saved for backward: each row's global log-sum-exp.
	lse := make([]float32, n)
	var den float64
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			x := in[0].Contiguous().Float32s()
			rowMax := make([]float32, n)
			cpu.RowMax(rowMax, x, n, vl)
			if r.Size() > 1 {
				if err := r.timed(func() error { return r.Group.AllReduce(r.ctx(), comm.Float32s(rowMax), comm.Max) }); err != nil {
					r.fail("vocab cross-entropy max all_reduce", err)
				}
			}
			// One all-reduce carries the sums of exponentials and the
			// target logits (shifted by the max).
			both := make([]float32, 2*n)
			cpu.RowExpSum(both[:n], x, rowMax, n, vl)
			for i := range n {
				if j := int(tg[i]) - start; j >= 0 && j < vl {
					both[n+i] = x[i*vl+j] - rowMax[i]
				}
			}
			r.allReduce("vocab cross-entropy sum all_reduce", both)
			var num float64
			den = 0
			for i := range n {
				w := float64(weight(i))
				l := math.Log(float64(both[i]))
				lse[i] = float32(float64(rowMax[i]) + l)
				num += (l - float64(both[n+i])) * w
				den += w
			}
			out := tp.Empty(1)
			out.Float32s()[0] = 0
			if den > 0 {
				out.Float32s()[0] = float32(num / den)
			}
			return []*tensor.Tensor{out}
		},
		bwd: func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
			x := logits.Contiguous().Float32s()
			gl := g[0].Float32s()[0]
			scale := make([]float32, n)
			if den > 0 {
				for i := range n {
					scale[i] = gl * weight(i) / float32(den)
				}
			}
			d := tp.Empty(n, vl)
			dx := d.Float32s()
			cpu.RowSoftmaxScaled(dx, x, lse, scale, n, vl)
			for i := range n {
				if j := int(tg[i]) - start; j >= 0 && j < vl {
					dx[i*vl+j] -= scale[i]
				}
			}
			return []*tensor.Tensor{d}
		},
	}, logits)[0]
}
