package comm

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/gotron/gotron/tensor"
)

// alignedF32 returns n float32s starting off elements past a 32-byte
// boundary.
func alignedF32(n, off int) []float32 {
	f := make([]float32, n+off+8)
	skip := int((32 - uintptr(unsafe.Pointer(unsafe.SliceData(f)))%32) % 32 / 4)
	return f[skip+off : skip+off+n]
}

// TestSumToNT checks the streaming-store sum against ReduceNTo's block
// loop, bit for bit: for odd lengths around the 32-element tile and the
// kernel's call block, at every 4-byte offset from a 32-byte boundary, for
// Sum and Avg, with destinations apart from the sources and aliasing them
// (as the in-process all-reduce calls it).
func TestSumToNT(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2: sumToNT always declines and ReduceNTo's block loop (tested elsewhere) runs")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	scales := []float32{1e-3, 1, 1e3} // mixed magnitudes: the order of the sum shows in the bits
	for _, n := range []int{0, 1, 7, 31, 32, 33, 95, 1000, 2*ntBlock + 37} {
		for off := range 8 {
			for _, nsrc := range []int{1, 2, 3, 5} {
				if n > ntBlock && (off%4 != 1 || nsrc != 3) {
					continue // the block boundary needs one case, not all
				}
				for _, avg := range []bool{false, true} {
					for _, alias := range []bool{false, true} {
						srcs := make([]Buffer, nsrc)
						for k := range srcs {
							f := alignedF32(n, off)
							for i := range f {
								f[i] = float32(rng.NormFloat64()) * scales[rng.IntN(len(scales))]
							}
							srcs[k] = Float32s(f)
						}
						ndst := nsrc
						if !alias {
							ndst = 1 + rng.IntN(4)
						}
						// want: the block loop on copies of the sources
						wsrcs := make([]Buffer, nsrc)
						for k := range wsrcs {
							wsrcs[k] = Float32s(append([]float32(nil), srcs[k].Float32()...))
						}
						want := Float32s(make([]float32, n))
						var tmp [blockElems]float32
						op := Sum
						if avg {
							op = Avg
						}
						reduceN([]Buffer{want}, wsrcs, op, tmp[:], n, Buffer.Float32)

						dsts := srcs
						if !alias {
							dsts = make([]Buffer, ndst)
							for k := range dsts {
								dsts[k] = Float32s(alignedF32(n, off))
							}
						}
						if !sumToNT(dsts, srcs, avg) {
							t.Fatalf("n=%d off=%d: sumToNT declined equally aligned destinations", n, off)
						}
						for k, d := range dsts {
							for i, v := range d.Float32() {
								if math.Float32bits(v) != math.Float32bits(want.Float32()[i]) {
									t.Fatalf("n=%d off=%d nsrc=%d avg=%v alias=%v: dst %d element %d = %v, want %v",
										n, off, nsrc, avg, alias, k, i, v, want.Float32()[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestSumToNTDeclines: destinations at different offsets from a 32-byte
// boundary cannot share one aligned body, so sumToNT leaves them alone.
func TestSumToNTDeclines(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	base := make([]float32, 200)
	a, b := Float32s(base[0:64]), Float32s(base[65:129])
	src := Float32s(make([]float32, 64))
	for i := range src.Float32() {
		src.Float32()[i] = 1
	}
	if sumToNT([]Buffer{a, b}, []Buffer{src}, false) {
		t.Fatal("sumToNT accepted destinations 4 bytes apart modulo 32")
	}
	for _, v := range base {
		if v != 0 {
			t.Fatal("sumToNT declined but wrote")
		}
	}
}

// BenchmarkReduceNTo4 is the in-process 4-rank all-reduce's work on one
// core: 4 sources of 16 MiB summed into the same 4 buffers, with the
// streaming stores (nt) and with the block loop's ordinary stores (block).
// GB/s counts the bytes read and written (2 · 4 · 16 MiB per op).
func BenchmarkReduceNTo4(b *testing.B) {
	const n, ranks = 4 << 20, 4
	bufs := make([]Buffer, ranks)
	for k := range bufs {
		bufs[k] = MakeBuffer(tensor.Float32, n)
	}
	for _, nt := range []bool{true, false} {
		name := "block"
		if nt {
			name = "nt"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(2 * ranks * 4 * n)
			for b.Loop() {
				if nt {
					sumToNT(bufs, bufs, false)
				} else {
					var tmp [blockElems]float32
					reduceN(bufs, bufs, Sum, tmp[:], n, Buffer.Float32)
				}
			}
		})
	}
}
