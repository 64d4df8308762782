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
		var mask [dropoutChunk]float32
		for c := lo; c < hi; c++ {
			i0, i1 := c*dropoutChunk, min((c+1)*dropoutChunk, len(o))
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
