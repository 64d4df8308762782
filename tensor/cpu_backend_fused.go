package tensor

import "github.com/gotron/gotron/internal/cpu"

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

// dropoutChunk is how many elements of a dropout mask the fused kernels
// draw at a time, into a stack buffer: a multiple of four, so each chunk
// starts at a Philox block.
const dropoutChunk = 1024

// dropoutMaskAt fills mask with elements [start, start+len(mask)) of the
// mask DropoutMask draws at rng (start a multiple of four): the stream is
// counter-based, so any chunk can be drawn alone.
func dropoutMaskAt(mask []float32, p float32, rng RNGState, start int) {
	r := RNG{key: rng.Key, offset: rng.Offset + uint64(start/4)}
	r.DropoutMask(mask, p)
}

// BiasDropoutAddForward sets out = residual + (y + b)·mask, b (c) or nil,
// the mask DropoutMask's at rng (none when p is 0), chunk by chunk from a
// stack buffer: the mask is never stored. float32(...) keeps the product
// rounded before the add, as the unfused Mul then Add round it.
func (cpuBackend) BiasDropoutAddForward(out, residual, y, b *Tensor, p float32, rng RNGState) {
	o, r, yy, bb := f(out), f(residual), f(y), f(b)
	cpu.Parallel((len(o)+dropoutChunk-1)/dropoutChunk, 16, func(lo, hi int) {
		var mask [dropoutChunk]float32
		for c := lo; c < hi; c++ {
			i0, i1 := c*dropoutChunk, min((c+1)*dropoutChunk, len(o))
			m := mask[:i1-i0]
			if p > 0 {
				dropoutMaskAt(m, p, rng, i0)
			}
			j := 0 // the bias column of element i0
			if bb != nil {
				j = i0 % len(bb)
			}
			for k := range m {
				i := i0 + k
				v := yy[i]
				if bb != nil {
					v += bb[j]
					if j++; j == len(bb) {
						j = 0
					}
				}
				if p > 0 {
					v = float32(v * m[k])
				}
				o[i] = r[i] + v
			}
		}
	})
}

// DropoutBackward accumulates dy += dout·mask, the mask DropoutMask's at
// rng, drawn again chunk by chunk.
func (cpuBackend) DropoutBackward(dy, dout *Tensor, p float32, rng RNGState) {
	d, g := f(dy), f(dout)
	cpu.Parallel((len(d)+dropoutChunk-1)/dropoutChunk, 16, func(lo, hi int) {
		var mask [dropoutChunk]float32
		for c := lo; c < hi; c++ {
			i0, i1 := c*dropoutChunk, min((c+1)*dropoutChunk, len(d))
			m := mask[:i1-i0]
			dropoutMaskAt(m, p, rng, i0)
			for k, v := range m {
				d[i0+k] += float32(g[i0+k] * v)
			}
		}
	})
}
