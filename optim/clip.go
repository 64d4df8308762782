package optim

import (
	"math"

	"github.com/gotron/gotron/internal/cpu"
)

// normBlock is the fixed block size (in scalars) of the partial sums behind
// SumSquares: partials are per block of the flat index space, so the result
// is bit-identical for any thread count.
const normBlock = 1 << 13

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
	f       flat
	partial []float64 // one per normBlock of the flat space
	scale   float32
	found   []bool // per block: saw NaN/Inf
	sumK    func(lo, hi int)
	maxK    func(lo, hi int)
	scaleK  func(lo, hi int)
	infK    func(lo, hi int)
}

// NewGrads builds a Grads over params, checking them as the optimizers do.
func NewGrads(params []*Param) (*Grads, error) {
	f, err := newFlat("grads", []Group{{Name: "all", Params: params}})
	if err != nil {
		return nil, err
	}
	nb := (f.total() + normBlock - 1) / normBlock
	g := &Grads{f: f, partial: make([]float64, nb), found: make([]bool, nb)}
	g.sumK = func(lo, hi int) { g.blocks(lo, hi, g.sumBlock) }
	g.maxK = func(lo, hi int) { g.blocks(lo, hi, g.maxBlock) }
	g.infK = func(lo, hi int) { g.blocks(lo, hi, g.infBlock) }
	g.scaleK = func(lo, hi int) { g.f.each(lo, hi, g.scaleRange) }
	return g, nil
}

// blocks runs fn on each block index in [lo, hi).
func (g *Grads) blocks(lo, hi int, fn func(blk int)) {
	for b := lo; b < hi; b++ {
		fn(b)
	}
}

// sumBlock stores Σ g² over block blk, accumulated in float64.
func (g *Grads) sumBlock(blk int) {
	s := 0.0
	g.f.each(blk*normBlock, min((blk+1)*normBlock, g.f.total()), func(i, a, b int) {
		s += sumSquares(g.f.params[i].Grad[a:b])
	})
	g.partial[blk] = s
}

// sumSquares returns Σ x² in float64 with four interleaved accumulators
// (a fixed order, so the result depends only on x).
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i]) * float64(x[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// maxBlock stores max |g| over block blk (NaN propagates).
func (g *Grads) maxBlock(blk int) {
	m := 0.0
	g.f.each(blk*normBlock, min((blk+1)*normBlock, g.f.total()), func(i, a, b int) {
		if ax := maxAbs(g.f.params[i].Grad[a:b]); ax > m || ax != ax {
			m = ax
		}
	})
	g.partial[blk] = m
}

// maxAbs returns max |x| (NaN if any x is NaN; 0 for empty x).
func maxAbs(x []float32) float64 {
	var m float32
	for _, v := range x {
		a := float32(math.Abs(float64(v)))
		if a > m || a != a {
			m = a
			if a != a {
				break
			}
		}
	}
	return float64(m)
}

// infBlock records whether block blk holds a NaN or ±Inf.
func (g *Grads) infBlock(blk int) {
	bad := false
	g.f.each(blk*normBlock, min((blk+1)*normBlock, g.f.total()), func(i, a, b int) {
		if cpu.NonFinite(g.f.params[i].Grad[a:b]) { // AVX-512/AVX2 scan
			bad = true
		}
	})
	g.found[blk] = bad
}

// SumSquares returns this rank's Σ g² over every gradient, the quantity
// Megatron all-reduces (SUM) before taking the square root. Each square is
// exact in float64 and the sum is accumulated in float64 in a fixed order
// (Megatron accumulates in float32; the results agree to float32 rounding).
func (g *Grads) SumSquares() float64 {
	cpu.Parallel(len(g.partial), 1, g.sumK)
	s := 0.0
	for _, p := range g.partial {
		s += p
	}
	return s
}

// MaxAbs returns this rank's max |g|, the quantity Megatron all-reduces (MAX)
// for the infinity norm (norm_type inf). NaN if any gradient is NaN.
func (g *Grads) MaxAbs() float64 {
	cpu.Parallel(len(g.partial), 1, g.maxK)
	m := 0.0
	for _, p := range g.partial {
		if p > m || p != p {
			m = p
		}
	}
	return m
}

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
	g.scale = float32(c)
	cpu.Parallel(g.f.total(), 1<<14, g.scaleK)
	return true
}

// scaleRange multiplies params[i].Grad[a:b] by g.scale.
func (g *Grads) scaleRange(i, a, b int) {
	s := g.scale
	gr := g.f.params[i].Grad[a:b]
	for j := range gr {
		gr[j] *= s
	}
}

// ClipGradNorm is the single-rank path: it computes the global L2 norm of
// all gradients, clips them to maxNorm (if > 0) and returns the norm before
// clipping, like torch.nn.utils.clip_grad_norm_ and Megatron's clip_grad_norm.
func (g *Grads) ClipGradNorm(maxNorm float64) float64 {
	norm := L2Norm(g.SumSquares())
	g.ClipByNorm(maxNorm, norm)
	return norm
}

// FoundInf reports whether any gradient is NaN or ±Inf on this rank
// (Megatron's found_inf; callers all-reduce it with MAX over the
// model-parallel group and skip the optimizer and scheduler step if set).
func (g *Grads) FoundInf() bool {
	cpu.Parallel(len(g.found), 1, g.infK)
	for _, b := range g.found {
		if b {
			return true
		}
	}
	return false
}
