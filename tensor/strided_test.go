package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// naiveOffsets lists the storage offset of every element of a view in
// row-major index order: the definition copyStrided and scatterAddStrided
// implement.
func naiveOffsets(shape, strides []int, offset int) []int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	offs := make([]int, 0, n)
	idx := make([]int, len(shape))
	for range n {
		off := offset
		for d, i := range idx {
			off += i * strides[d]
		}
		offs = append(offs, off)
		for d := len(idx) - 1; d >= 0; d-- {
			if idx[d]++; idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return offs
}

// TestStridedCopyAndScatter checks copyStrided and scatterAddStrided
// against naiveOffsets on transposed, narrowed and split views, small and
// large enough to run on several threads, in every dtype copy supports.
func TestStridedCopyAndScatter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type view struct {
		name string
		make func(tp *Tape, x *Tensor) *Tensor
	}
	views := []view{
		{"transpose01", func(tp *Tape, x *Tensor) *Tensor { return tp.Transpose(x, 0, 1) }},
		{"transpose12", func(tp *Tape, x *Tensor) *Tensor { return tp.Transpose(x, 1, 2) }},
		{"narrow-last", func(tp *Tape, x *Tensor) *Tensor { return tp.Narrow(x, 2, 1, x.Dim(2)-2) }},
		{"split-qkv-k", func(tp *Tape, x *Tensor) *Tensor {
			d := x.Dim(2) / 4
			return tp.Split(x, 2, 2*d, d, x.Dim(2)-3*d)[1]
		}},
		{"narrow-mid-transposed", func(tp *Tape, x *Tensor) *Tensor {
			return tp.Transpose(tp.Narrow(x, 1, 1, x.Dim(1)-1), 0, 2)
		}},
	}
	for _, shape := range [][]int{{3, 4, 8}, {16, 64, 256}} { // the second is parallel
		for _, v := range views {
			t.Run(fmt.Sprintf("%s/%v", v.name, shape), func(t *testing.T) {
				x := New(Float32, shape...)
				for i := range x.f32 {
					x.f32[i] = rng.Float32()
				}
				tp := NewTape()
				view := v.make(tp, x)
				offs := naiveOffsets(view.shape, view.strides, view.offset)

				got := New(Float32, view.shape...)
				copyStrided(got, view)
				for i, off := range offs {
					if got.f32[i] != x.f32[off] {
						t.Fatalf("copy: element %d = %v, want x[%d] = %v", i, got.f32[i], off, x.f32[off])
					}
				}
				for _, dt := range []DType{Int32, Int64, BFloat16} {
					xi := New(dt, shape...)
					fill(xi)
					vi := xi.view(view.shape, view.strides, view.offset)
					gi := New(dt, view.shape...)
					copyStrided(gi, vi)
					for i, off := range offs {
						if at(gi, i) != at(xi, off) {
							t.Fatalf("%s copy: element %d = %v, want %v", dt, i, at(gi, i), at(xi, off))
						}
					}
				}

				dst := New(Float32, shape...)
				want := make([]float32, len(dst.f32))
				for i := range dst.f32 {
					dst.f32[i] = float32(i % 7)
					want[i] = dst.f32[i]
				}
				g := New(Float32, view.shape...)
				for i := range g.f32 {
					g.f32[i] = rng.Float32()
					want[offs[i]] += g.f32[i]
				}
				scatterAddStrided(dst, view, g)
				for i := range want {
					if dst.f32[i] != want[i] {
						t.Fatalf("scatter-add: dst[%d] = %v, want %v", i, dst.f32[i], want[i])
					}
				}
			})
		}
	}
}

func fill(t *Tensor) {
	for i := range t.Numel() {
		switch t.dtype {
		case Int32:
			t.i32[i] = int32(i)
		case Int64:
			t.i64[i] = int64(i) << 33
		case BFloat16, Float16:
			t.u16[i] = uint16(i)
		}
	}
}

func at(t *Tensor, i int) int64 {
	switch t.dtype {
	case Int32:
		return int64(t.i32[i])
	case Int64:
		return t.i64[i]
	default:
		return int64(t.u16[i])
	}
}

// TestInjective: the check that lets scatter-add run rows in parallel.
func TestInjective(t *testing.T) {
	for _, c := range []struct {
		shape, strides []int
		want           bool
	}{
		{[]int{4, 8}, []int{8, 1}, true},
		{[]int{8, 4}, []int{1, 8}, true},         // transposed
		{[]int{2, 16, 4}, []int{96, 6, 1}, true}, // a split of width 4 out of 6
		{[]int{4, 8}, []int{0, 1}, false},        // broadcast
		{[]int{4, 8}, []int{4, 1}, false},        // rows overlap
		{[]int{1, 8}, []int{0, 1}, true},         // size-1 dims do not matter
		{[]int{3, 3}, []int{2, 3}, false},        // injective in fact, but interleaved: the check is conservative (scatter runs serially)
		{[]int{}, []int{}, true},
	} {
		if got := injective(c.shape, c.strides); got != c.want {
			t.Errorf("injective(%v, %v) = %v, want %v", c.shape, c.strides, got, c.want)
		}
	}
}
