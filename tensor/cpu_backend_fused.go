package tensor

import (
	"math"
	"unsafe"

	"github.com/gotron/gotron/internal/cpu"
)

// The fused elementwise ops (ops_fused.go) on the CPU: the bias-activation
// kernels are internal/cpu's; bias-dropout-add draws its mask here, from
// the Philox stream package tensor owns.

func (cpuBackend) BiasGELUForward(out, y, b *Tensor, tanh bool) {
	cpu.BiasGELUForward(f(out), f(y), f(b), tanh)
}

func (cpuBackend) BiasGELUBackward(dy, dout, y, b *Tensor, tanh bool) {
	cpu.BiasGELUBackward(f(dy), f(dout), f(y), f(b), tanh)
}

func (cpuBackend) BiasSwiGLUForward(out, y, b *Tensor) {
	n, c := rowsCols(y)
	cpu.BiasSwiGLUForward(f(out), f(y), f(b), n, c/2)
}

func (cpuBackend) BiasSwiGLUBackward(dy, dout, y, b *Tensor) {
	n, c := rowsCols(y)
	cpu.BiasSwiGLUBackward(f(dy), f(dout), f(y), f(b), n, c/2)
}

// dropoutChunk is how many elements bias-dropout-add takes at a time: a
// multiple of 32, so each chunk starts at a Philox block and owns whole
// words of the kept bits.
const dropoutChunk = 1024

// dropoutMaskAt fills mask with elements [start, start+len(mask)) of the
// mask DropoutMask draws at rng (start a multiple of four).
func dropoutMaskAt(mask []float32, p float32, rng RNGState, start int) {
	r := RNG{key: rng.Key, offset: rng.Offset + uint64(start/4)}
	r.DropoutMask(mask, p)
}

// maskWords views the float32 slots of keep as the uint32 words of a bit
// mask (the slots hold bits, not numbers: never read them as floats).
func maskWords(keep *Tensor) []uint32 {
	f := keep.f32s()
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&f[0])), len(f))
}

// BiasDropoutAddForward sets out = residual + (y + b)·mask, b (c) or nil,
// the mask DropoutMask's at rng (none when p is 0), drawn chunk by chunk
// (the stream is counter-based, so chunks run in parallel) into a stack
// buffer and kept as bits: drawing takes most of the op's time here, so the
// backward reads the bits rather than draw again. float32(...) keeps the
// product rounded before the add, as the unfused Mul then Add round it.
func (cpuBackend) BiasDropoutAddForward(out, kept, residual, y, b *Tensor, p float32, rng RNGState) {
	o, r, yy, bb := f(out), f(residual), f(y), f(b)
	var words []uint32
	if p != 0 {
		words = maskWords(kept)
	}
	cpu.Parallel((len(o)+dropoutChunk-1)/dropoutChunk, 16, func(lo, hi int) {
		biasDropoutAddRange(o, words, r, yy, bb, p, rng, lo*dropoutChunk, min(hi*dropoutChunk, len(o)))
	})
}

// biasDropoutAddRange is BiasDropoutAddForward on elements [i0, i1), i0 a
// multiple of 32 (a Philox block and a word of bits start there), a chunk
// at a time; the words it writes are its own unless i1 is not a multiple
// of 32 and is not the end.
func biasDropoutAddRange(o []float32, words []uint32, r, yy, bb []float32, p float32, rng RNGState, i0, i1 int) {
	var mask [dropoutChunk]float32
	for ; i0 < i1; i0 += dropoutChunk {
		i1 := min(i0+dropoutChunk, i1)
		v, rr := o[i0:i1], r[i0:i1]
		if bb != nil {
			addBias(v, yy[i0:i1], bb, i0)
		} else {
			copy(v, yy[i0:i1])
		}
		if p == 0 {
			cpu.Add(v, v, rr)
			continue
		}
		m := mask[:len(v)]
		dropoutMaskAt(m, p, rng, i0)
		for k := range v {
			v[k] = rr[k] + float32(v[k]*m[k])
		}
		for w := 0; w < len(m); w += 32 {
			var bits uint32
			for k, x := range m[w:min(w+32, len(m))] {
				u := math.Float32bits(x) // +0 or a positive scale
				bits |= (u | -u) >> 31 << k
			}
			words[(i0+w)/32] = bits
		}
	}
}

// addNormRows is how many rows BiasDropoutAddNormForward takes at a time
// for rows of c elements: 16 (LayerNormForward's grain: it normalizes
// four rows at a time), or 32 when c is odd, so that each group starts at
// a word of the mask's bits (a multiple of 32/gcd(c, 32) rows).
func addNormRows(c int) int {
	g := 32
	for d := c; g > 1 && d%2 == 0; d /= 2 {
		g /= 2
	}
	return max(g, 16)
}

// BiasDropoutAddNormForward is BiasDropoutAddForward into sum, then
// LayerNormForward (RMSNormForward when mean is nil) of sum into out, a
// group of rows at a time while they are in cache: each element and each
// row's statistics are computed by the same code as the two ops', so the
// numbers are theirs bit for bit.
func (cpuBackend) BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32) {
	n, c := rowsCols(y)
	s, o, r, yy, bb, ww, nbb, rs := f(sum), f(out), f(residual), f(y), f(b), f(w), f(nb), f(rstd)
	var mm []float32
	if mean != nil {
		mm = f(mean)
	}
	var words []uint32
	if p != 0 {
		words = maskWords(keep)
	}
	g := addNormRows(c)
	cpu.Parallel((n+g-1)/g, 1, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			r0, r1 := u*g, min((u+1)*g, n)
			biasDropoutAddRange(s, words, r, yy, bb, p, rng, r0*c, r1*c)
			// at most 16 rows a call: the norm kernels then run them on
			// this goroutine (their grain), not as a nested parallel loop
			for a := r0; a < r1; a += 16 {
				z := min(a+16, r1)
				if mm == nil {
					cpu.RMSNormForward(o[a*c:z*c], rs[a:z], s[a*c:z*c], ww, z-a, c, eps)
				} else {
					cpu.LayerNormForward(o[a*c:z*c], mm[a:z], rs[a:z], s[a*c:z*c], ww, nbb, z-a, c, eps)
				}
			}
		}
	})
}

// addBias sets t[k] = y[k] + b[(start+k) mod len(b)], a row segment at a
// time through cpu.Add.
func addBias(t, y, b []float32, start int) {
	c := len(b)
	j := start % c
	for k := 0; k < len(y); {
		n := min(c-j, len(y)-k)
		cpu.Add(t[k:k+n], y[k:k+n], b[j:j+n])
		k += n
		j = 0
	}
}

// DropoutBackward accumulates dy += dout·mask from the kept bits: a kept
// element's mask is 1/(1-p) computed as RNG.DropoutMask computes it, a
// dropped one's 0 (multiplied, not selected, as the unfused Mul does).
func (cpuBackend) DropoutBackward(dy, dout, keep *Tensor, p float32, _ RNGState) {
	d, g, words := f(dy), f(dout), maskWords(keep)
	scale := 1 / (1 - p)
	if p >= 1 {
		scale = 0 // every bit is clear: the mask is all zeros
	}
	cpu.Parallel((len(d)+dropoutChunk-1)/dropoutChunk, 16, func(lo, hi int) {
		for i := lo * dropoutChunk; i < min(hi*dropoutChunk, len(d)); i++ {
			m := scale * float32(words[i/32]>>(i%32)&1) // the mask: scale or 0
			d[i] += float32(g[i] * m)
		}
	})
}
