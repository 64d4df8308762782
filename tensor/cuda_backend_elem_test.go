package tensor

import (
	"math/rand/v2"
	"testing"
)

// viewOffset is copy.cu's view_offset in Go: the storage offset of the
// row-major element i of the view cudaViewGeom describes.
func viewOffset(i int64, geom []any) int64 {
	var off int64
	for d := cudaMaxDims - 1; d >= 0; d-- {
		n, s := geom[d].(int64), geom[cudaMaxDims+d].(int64)
		if n != 1 {
			off += i % n * s
			i /= n
		}
	}
	return off
}

// TestCUDAViewGeom: the merged geometry the copy kernels take addresses
// the same storage, in the same order, as the view's own shape and strides
// (transposes, narrows, broadcasts, size-1 dims, up to 10 dims that merge).
func TestCUDAViewGeom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		nd := 1 + rng.IntN(10)
		shape := make([]int, nd)
		for d := range shape {
			shape[d] = 1 + rng.IntN(4)
		}
		// Strides of a dense tensor of a larger shape, permuted, some
		// zeroed (broadcast), some dims continuing the next (mergeable).
		strides := make([]int, nd)
		s := 1
		for d := nd - 1; d >= 0; d-- {
			strides[d] = s
			s *= shape[d] + rng.IntN(2)
		}
		if nd > 8 { // keep it mergeable down to 8 dims: dense
			s = 1
			for d := nd - 1; d >= 0; d-- {
				strides[d] = s
				s *= shape[d]
			}
		} else {
			rng.Shuffle(nd, func(i, j int) { strides[i], strides[j] = strides[j], strides[i] })
			if rng.IntN(4) == 0 {
				strides[rng.IntN(nd)] = 0
			}
		}
		geom := cudaViewGeom(shape, strides)
		idx := make([]int, nd)
		for i := range int64(numel(shape)) {
			var want int64
			for d := range nd {
				want += int64(idx[d] * strides[d])
			}
			if got := viewOffset(i, geom); got != want {
				t.Fatalf("trial %d: shape %v strides %v (geometry %v): element %d at %d, want %d", trial, shape, strides, geom, i, got, want)
			}
			for d := nd - 1; d >= 0; d-- {
				if idx[d]++; idx[d] < shape[d] {
					break
				}
				idx[d] = 0
			}
		}
	}
}
