package cpu

import "math"

// The kernels below are the row passes of a cross-entropy whose classes are
// split across ranks (Megatron's vocab_parallel_cross_entropy,
// megatron/core/tensor_parallel/cross_entropy.py):
// each rank takes the row max of its slice, the maxima are all-reduced, then
// each rank sums exponentials shifted by the global max, the sums are
// all-reduced, and backward writes the softmax of the slice against the
// global log-sum-exp. They run over rows with Parallel and use the same
// vectorised exp as CrossEntropyForward/Backward (float32 lanes, AVX-512 or
// AVX2 per ActiveISA), so a split vocabulary costs what the whole one does.

// RowMax sets m[i] = max_j x[i*v+j] for the n rows of x (n, v).
func RowMax(m, x []float32, n, v int) {
	_, _ = m[:n], x[:n*v]
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			m[i] = maxRowF32(float32(math.Inf(-1)), x[i*v:i*v+v])
		}
	})
}

// RowExpSum sets s[i] = Σ_j exp(x[i*v+j] - m[i]) for the n rows of x (n, v);
// x is not written.
func RowExpSum(s, x, m []float32, n, v int) {
	_, _, _ = s[:n], x[:n*v], m[:n]
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s[i] = expSumF32(x[i*v:i*v+v], m[i])
		}
	})
}

// RowSoftmaxScaled sets dst[i*v+j] = scale[i]·exp(x[i*v+j] - lse[i]) for the
// n rows of x (n, v): with lse the (global) log-sum-exp of each row it is
// the softmax's share of the cross-entropy gradient, the target's −scale[i]
// being the caller's to add. It overwrites dst, which may alias x.
func RowSoftmaxScaled(dst, x, lse, scale []float32, n, v int) {
	_, _, _, _ = dst[:n*v], x[:n*v], lse[:n], scale[:n]
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d, xi, g := dst[i*v:i*v+v], x[i*v:i*v+v], scale[i]
			// As CrossEntropyBackward with no smoothing (the same bits).
			j := ceGradVec(d, xi, lse[i], g, 0)
			tail := d[j:]
			copy(tail, xi[j:]) // no-op when dst aliases x
			expSubF32(tail, lse[i])
			for k := range tail {
				tail[k] *= g
			}
		}
	})
}
