package tensor

import (
	"math"

	"github.com/gotron/gotron/internal/half"
)

// The CPU's memory, reduction and autograd-bookkeeping methods (the
// Backend's last block): the loops package tensor ran on host storage
// before, moved here unchanged so results keep their bits.

func (cpuBackend) Fill(t *Tensor, v float32) {
	n, o := t.Numel(), t.offset
	switch t.dtype {
	case Float32:
		s := t.f32[o : o+n]
		if v == 0 && !signbit32(v) {
			clear(s)
			return
		}
		for i := range s {
			s[i] = v
		}
	case BFloat16:
		fillRun(t.u16[o:o+n], uint16(half.BFloat16From(v)))
	case Float16:
		fillRun(t.u16[o:o+n], uint16(half.Float16From(v)))
	case Int32:
		fillRun(t.i32[o:o+n], int32(v))
	case Int64:
		fillRun(t.i64[o:o+n], int64(v))
	}
}

func signbit32(v float32) bool { return v == 0 && 1/v < 0 }

func fillRun[E comparable](s []E, v E) {
	var zero E
	if v == zero {
		clear(s)
		return
	}
	for i := range s {
		s[i] = v
	}
}

func (cpuBackend) CopyStrided(dst, src *Tensor) {
	switch {
	case src.Numel() == 0:
	case dst.IsContiguous() && src.IsContiguous():
		n, so, do := src.Numel(), src.offset, dst.offset
		switch src.dtype {
		case Float32:
			copy(dst.f32[do:do+n], src.f32[so:so+n])
		case BFloat16, Float16:
			copy(dst.u16[do:do+n], src.u16[so:so+n])
		case Int32:
			copy(dst.i32[do:do+n], src.i32[so:so+n])
		case Int64:
			copy(dst.i64[do:do+n], src.i64[so:so+n])
		}
	case dst.IsContiguous():
		copyStrided(dst, src)
	case src.IsContiguous():
		storeStrided(dst, src)
	default:
		panic("tensor: CopyStrided between two strided views")
	}
}

func (cpuBackend) ScatterAddStrided(dst, v, g *Tensor) { scatterAddStrided(dst, v, g) }

func (cpuBackend) SumAll(out, x *Tensor) {
	var s float64
	for _, v := range f(x) {
		s += float64(v)
	}
	f(out)[0] = float32(s)
}

func (cpuBackend) RowSum(out, x *Tensor) {
	n, c := rowsCols(x)
	xs, o := f(x), f(out)
	for r := range n {
		var s float32
		for _, v := range xs[r*c : (r+1)*c] {
			s += v
		}
		o[r] = s
	}
}

func (cpuBackend) RowArgMax(out, arg, x *Tensor) {
	n, c := rowsCols(x)
	xs, o, a := f(x), f(out), arg.i32s()
	for r := range n {
		best := 0
		for j := 1; j < c; j++ {
			if xs[r*c+j] > xs[r*c+best] {
				best = j
			}
		}
		a[r] = int32(best)
		o[r] = xs[r*c+best]
	}
}

func (cpuBackend) AddRowBroadcast(dx, g *Tensor) {
	d, gs := f(dx), f(g)
	n := len(gs)
	if n == 0 || len(d) == 0 {
		return
	}
	c := len(d) / n
	for r := range n {
		for j := range c {
			d[r*c+j] += gs[r]
		}
	}
}

func (cpuBackend) AddAtRowIndex(dx, arg, g *Tensor) {
	d, gs, a := f(dx), f(g), arg.i32s()
	n := len(gs)
	if n == 0 || len(d) == 0 {
		return
	}
	c := len(d) / n
	for r := range n {
		d[r*c+int(a[r])] += gs[r]
	}
}

func (cpuBackend) DropoutMask(mask *Tensor, p float32, rng RNGState) {
	r := RNG{key: rng.Key, offset: rng.Offset}
	r.DropoutMask(f(mask), p)
}

func (cpuBackend) LossMaskMean(out, w, denT, losses, mask *Tensor) {
	ws, ls := f(w), f(losses)
	var ms []float32
	if mask != nil {
		ms = f(mask)
	}
	var den float64
	for i := range ws {
		m := float32(1)
		if ms != nil {
			m = ms[i]
		}
		ws[i] = m
		den += float64(m)
	}
	var num float64
	for i, l := range ls {
		num += float64(l) * float64(ws[i])
	}
	o := f(out)
	o[0] = 0
	if den > 0 {
		o[0] = float32(num / den)
	}
	denT.i64[denT.offset] = int64(math.Float64bits(den))
}

func (cpuBackend) LossMaskScale(w, dout, denT *Tensor) {
	den := math.Float64frombits(uint64(denT.i64[denT.offset]))
	ws, g := f(w), f(dout)[0]
	for i := range ws {
		if den > 0 {
			ws[i] *= g / float32(den)
		} else {
			ws[i] = 0
		}
	}
}

func (cpuBackend) Convert(dst, src *Tensor) {
	for i := range src.Numel() {
		var v float32
		switch src.dtype {
		case Float32:
			v = src.f32[src.offset+i]
		case BFloat16:
			v = BFloat16ToFloat32(src.u16[src.offset+i])
		case Float16:
			v = Float16ToFloat32(src.u16[src.offset+i])
		case Int32:
			v = float32(src.i32[src.offset+i])
		case Int64:
			v = float32(src.i64[src.offset+i])
		}
		o := dst.offset + i
		switch dst.dtype {
		case Float32:
			dst.f32[o] = v
		case BFloat16:
			dst.u16[o] = Float32ToBFloat16(v)
		case Float16:
			dst.u16[o] = Float32ToFloat16(v)
		case Int32:
			dst.i32[o] = int32(v)
		case Int64:
			dst.i64[o] = int64(v)
		}
	}
}

// storeStrided copies dense src into the positions the strided view dst
// addresses.
func storeStrided(dst, src *Tensor) {
	r := newStridedRows(dst.shape, dst.strides, dst.offset)
	L, step := r.rowLen, r.step
	fn := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d, o := r.start(i), i*L
			switch src.dtype {
			case Float32:
				scatterRun(dst.f32, src.f32[src.offset+o:src.offset+o+L], d, step)
			case BFloat16, Float16:
				scatterRun(dst.u16, src.u16[src.offset+o:src.offset+o+L], d, step)
			case Int32:
				scatterRun(dst.i32, src.i32[src.offset+o:src.offset+o+L], d, step)
			case Int64:
				scatterRun(dst.i64, src.i64[src.offset+o:src.offset+o+L], d, step)
			}
		}
	}
	if !injective(dst.shape, dst.strides) {
		fn(0, r.nrows)
		return
	}
	r.parallelRows(fn)
}

// scatterRun copies src into dst[d], dst[d+step], ...
func scatterRun[E any](dst, src []E, d, step int) {
	if step == 1 {
		copy(dst[d:d+len(src)], src)
		return
	}
	for j, v := range src {
		dst[d+j*step] = v
	}
}
