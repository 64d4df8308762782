package optim

import (
	"math"

	"github.com/gotron/gotron/tensor"
)

// Grads computes statistics of, and rescales, the gradients of a fixed list
// of parameters: gradient clipping by global norm (--clip-grad) and NaN/Inf
// detection. It mirrors megatron/core/optimizer/clip_grads.py.
//
// The norm is split so data- and tensor-parallel code can combine ranks:
//
//	local := g.SumSquares()               // Σ g² over this rank's grads (float64)
//	total := allReduceSum(local)          // caller's collective, e.g. over the model-parallel group
//	norm := optim.L2Norm(total)           // √total
//	g.ClipByNorm(clipGrad, norm)          // scale by clipGrad/(norm+1e-6) if that is < 1
//
// On one rank ClipGradNorm does all four. Megatron sums squares only over
// parameters that are not tensor-parallel (or shared) duplicates but clips
// every parameter; with tensor parallelism use one Grads over the
// non-duplicates for SumSquares and one over all parameters for ClipByNorm.
// Grads is not safe for concurrent use.
type Grads struct {
	f     flat
	grads *tensor.TensorList // every params[i].Grad, in order
}

// NewGrads builds a Grads over params, checking them as the optimizers do.
func NewGrads(params []*Param) (*Grads, error) {
	f, err := newFlat("grads", []Group{{Name: "all", Params: params}})
	if err != nil {
		return nil, err
	}
	_, grads, err := f.lists("grads")
	if err != nil {
		return nil, err
	}
	return &Grads{f: f, grads: grads}, nil
}

// SumSquares returns this rank's Σ g² over every gradient, the quantity
// Megatron all-reduces (SUM) before taking the square root. Each square is
// exact in float64 and the sum is accumulated in float64 in a fixed order
// (Megatron accumulates in float32; the results agree to float32 rounding):
// tensor.SumSquares, whose blocks make it bit-identical for any thread count.
func (g *Grads) SumSquares() float64 { return tensor.SumSquares(g.grads) }

// SumSquaresTo writes SumSquares's float64 bits into out, an Int64 (1)
// tensor on the gradients' device, without reading it back: a training
// step reads its statistics back together (tensor.ReadBack).
func (g *Grads) SumSquaresTo(out *tensor.Tensor) { tensor.SumSquaresTo(out, g.grads) }

// CountZeros returns how many of this rank's gradient elements are zero
// (-0 included), the quantity Megatron's count_zeros_fp32 all-reduces (SUM)
// for --log-num-zeros-in-grad. It reads the gradients on the host: CPU
// tensors only.
func (g *Grads) CountZeros() int64 {
	n := int64(0)
	for i := range g.grads.Len() {
		for _, v := range g.grads.At(i).Float32s() {
			if v == 0 {
				n++
			}
		}
	}
	return n
}

// MaxAbs returns this rank's max |g|, the quantity Megatron all-reduces (MAX)
// for the infinity norm (norm_type inf). NaN if any gradient is NaN.
func (g *Grads) MaxAbs() float64 { return tensor.MaxAbs(g.grads) }

// L2Norm finishes a global L2 norm from the all-reduced sum of squares.
func L2Norm(sumSquares float64) float64 { return math.Sqrt(sumSquares) }

// ClipCoeff is Megatron's clip coefficient max_norm/(total_norm + 1e-6);
// gradients are scaled only when it is < 1 (never for a NaN norm; an
// infinite norm gives 0).
func ClipCoeff(maxNorm, totalNorm float64) float64 { return maxNorm / (totalNorm + 1e-6) }

// ClipByNorm scales every gradient by ClipCoeff(maxNorm, totalNorm) (rounded
// to float32, as Apex's multi_tensor_scale takes a float) when that is < 1,
// and reports whether it did. maxNorm <= 0 disables clipping, as --clip-grad 0
// does in Megatron.
func (g *Grads) ClipByNorm(maxNorm, totalNorm float64) bool {
	if maxNorm <= 0 {
		return false
	}
	c := ClipCoeff(maxNorm, totalNorm)
	if !(c < 1) {
		return false
	}
	tensor.ScaleList(g.grads, float32(c))
	return true
}

// ClipGradNorm is the single-rank path: it computes the global L2 norm of
// all gradients, clips them to maxNorm (if > 0) and returns the norm before
// clipping, like torch.nn.utils.clip_grad_norm_ and Megatron's clip_grad_norm.
func (g *Grads) ClipGradNorm(maxNorm float64) float64 {
	norm := L2Norm(g.SumSquares())
	g.ClipByNorm(maxNorm, norm)
	return norm
}

// Scale multiplies every gradient by s (Megatron's scale_gradients, as
// --calculate-per-token-loss divides the reduced gradients by the global
// batch's token count).
func (g *Grads) Scale(s float32) { tensor.ScaleList(g.grads, s) }

// FoundInf reports whether any gradient is NaN or ±Inf on this rank
// (Megatron's found_inf; callers all-reduce it with MAX over the
// model-parallel group and skip the optimizer and scheduler step if set).
func (g *Grads) FoundInf() bool { return tensor.NonFinite(g.grads) }

// FoundInfTo writes FoundInf into out, an Int32 (1) tensor on the
// gradients' device (1 for true), without reading it back.
func (g *Grads) FoundInfTo(out *tensor.Tensor) { tensor.NonFiniteTo(out, g.grads) }
