package tensor

import (
	"slices"

	"github.com/gotron/gotron/internal/cpu"
)

// stridedRows walks a strided view as nrows runs of rowLen elements, the
// elements of a run step apart: trailing dims that continue each other
// are merged, so a view that is dense inside its rows (a split of a fused
// QKV projection, a narrowed sequence) copies a row at a time.
type stridedRows struct {
	shape, strides []int // the outer (unmerged) dims
	offset         int
	rowLen, step   int
	nrows          int
}

func newStridedRows(shape, strides []int, offset int) stridedRows {
	nd := len(shape)
	r := stridedRows{offset: offset, rowLen: 1, step: 1, nrows: 1}
	if nd == 0 {
		return r
	}
	d := nd - 1
	r.rowLen, r.step = shape[d], strides[d]
	for d > 0 && strides[d-1] == r.step*r.rowLen {
		d--
		r.rowLen *= shape[d]
	}
	r.shape, r.strides = shape[:d], strides[:d]
	for _, s := range r.shape {
		r.nrows *= s
	}
	return r
}

// start returns the storage offset of run i.
func (r *stridedRows) start(i int) int {
	off := r.offset
	for d := len(r.shape) - 1; d >= 0; d-- {
		off += i % r.shape[d] * r.strides[d]
		i /= r.shape[d]
	}
	return off
}

// parallelRows runs fn over [0, nrows) in chunks, on several threads when
// the view holds enough elements to pay for them.
func (r *stridedRows) parallelRows(fn func(lo, hi int)) {
	const grainElems = 1 << 15
	if r.nrows*r.rowLen < 2*grainElems {
		fn(0, r.nrows)
		return
	}
	cpu.Parallel(r.nrows, max(1, grainElems/max(r.rowLen, 1)), fn)
}

// copyStrided copies src's elements into dense dst of the same element
// count (from dst's offset).
func copyStrided(dst, src *Tensor) {
	if src.Numel() == 0 {
		return
	}
	r := newStridedRows(src.shape, src.strides, src.offset)
	L, step := r.rowLen, r.step
	r.parallelRows(func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s, o := r.start(i), dst.offset+i*L
			switch src.dtype {
			case Float32:
				gatherRun(dst.f32[o:o+L], src.f32, s, step)
			case BFloat16, Float16:
				gatherRun(dst.u16[o:o+L], src.u16, s, step)
			case Int32:
				gatherRun(dst.i32[o:o+L], src.i32, s, step)
			case Int64:
				gatherRun(dst.i64[o:o+L], src.i64, s, step)
			}
		}
	})
}

// gatherRun copies src[s], src[s+step], ... into dst.
func gatherRun[E any](dst, src []E, s, step int) {
	if step == 1 {
		copy(dst, src[s:s+len(dst)])
		return
	}
	for j := range dst {
		dst[j] = src[s+j*step]
	}
}

// scatterAddStrided adds dense g into dst at the positions view v (a strided
// view of dst's tensor) addresses. Rows run in parallel only when no two
// elements of the view share storage (a broadcast view would race).
func scatterAddStrided(dst, v, g *Tensor) {
	if v.Numel() == 0 {
		return
	}
	r := newStridedRows(v.shape, v.strides, v.offset-v.base.offset)
	d, gg := dst.f32s(), g.f32s()
	L, step := r.rowLen, r.step
	fn := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s, src := r.start(i), gg[i*L:(i+1)*L]
			if step == 1 {
				cpu.Axpy(d[s:s+L], src, 1)
				continue
			}
			for j, x := range src {
				d[s+j*step] += x
			}
		}
	}
	if !injective(v.shape, v.strides) {
		fn(0, r.nrows)
		return
	}
	r.parallelRows(fn)
}

// injective reports whether distinct indices of a view with these strides
// address distinct storage (sorted by stride, each dim steps past the whole
// extent of the smaller ones).
func injective(shape, strides []int) bool {
	type dim struct{ n, s int }
	var dims []dim
	for i, n := range shape {
		if n > 1 {
			if strides[i] <= 0 {
				return false
			}
			dims = append(dims, dim{n, strides[i]})
		}
	}
	slices.SortFunc(dims, func(a, b dim) int { return a.s - b.s })
	extent := 1 // one past the largest offset reachable by the dims so far
	for _, d := range dims {
		if d.s < extent {
			return false
		}
		extent += d.s * (d.n - 1)
	}
	return true
}
