package cpu

import "math"

// actGrain is the minimum number of elements one goroutine takes in the
// elementwise kernels.
const actGrain = 1 << 14

// geluTanhK is sqrt(2/pi), the constant of the tanh approximation.
const geluTanhK = 0.7978845608028654

// GELUTanhForward computes out = 0.5*x*(1+tanh(sqrt(2/π)*(x+0.044715x³))),
// torch's gelu(approximate="tanh") and Megatron's bias_gelu. inp, out: (any).
// It evaluates the identical x*sigmoid(2u) in float32 (no cancellation in
// 1+tanh for negative x), exp vectorised in chunks, accurate to a few ulp.
//
// With AVX-512 one fused kernel does it in a pass, bit-identical to the Go
// loops below (which run on other ISAs and on the last few elements).
func GELUTanhForward(out, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := geluTanhForwardVec(out[lo:hi], inp[lo:hi])
		geluTanhForwardGo(out[lo+n:hi], inp[lo+n:hi])
	})
}

// geluTanhForwardGo is GELUTanhForward on the calling goroutine, in chunks
// through the vectorised exp.
func geluTanhForwardGo(out, inp []float32) {
	var buf [actChunk]float32
	for i0 := 0; i0 < len(inp); i0 += actChunk {
		x := inp[i0:min(i0+actChunk, len(inp))]
		s, o := buf[:len(x)], out[i0:i0+len(x)]
		for i, v := range x {
			s[i] = 2 * geluTanhK * (v + 0.044715*v*v*v)
		}
		sigmoidOf(s)
		for i, v := range x {
			o[i] = v * s[i]
		}
	}
}

// GELUTanhBackward accumulates dinp += dout * d/dx GELUTanh(inp)
// = dout * (s + 2x·s(1-s)·sqrt(2/π)(1+3·0.044715x²)), s = sigmoid(2u).
func GELUTanhBackward(dinp, dout, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := geluTanhBackwardVec(dinp[lo:hi], dout[lo:hi], inp[lo:hi])
		geluTanhBackwardGo(dinp[lo+n:hi], dout[lo+n:hi], inp[lo+n:hi])
	})
}

// geluTanhBackwardGo is GELUTanhBackward on the calling goroutine.
func geluTanhBackwardGo(dinp, dout, inp []float32) {
	var buf [actChunk]float32
	for i0 := 0; i0 < len(inp); i0 += actChunk {
		x := inp[i0:min(i0+actChunk, len(inp))]
		s, g, dx := buf[:len(x)], dout[i0:i0+len(x)], dinp[i0:i0+len(x)]
		for i, v := range x {
			s[i] = 2 * geluTanhK * (v + 0.044715*v*v*v)
		}
		sigmoidOf(s)
		for i, v := range x {
			dx[i] += g[i] * (s[i] + 2*v*s[i]*(1-s[i])*geluTanhK*(1+3*0.044715*v*v))
		}
	}
}

// geluTanhGrad is the float64 derivative of the tanh-form GELU (references).
func geluTanhGrad(x float64) float64 {
	u := geluTanhK * (x + 0.044715*x*x*x)
	t := math.Tanh(u)
	sech2 := 1 - t*t
	return 0.5*(1+t) + 0.5*x*sech2*geluTanhK*(1+3*0.044715*x*x)
}

// GELUErfForward computes the exact GELU out = 0.5*x*(1+erf(x/√2)), torch's
// default F.gelu and Megatron's default activation. inp, out: (any).
//
// With AVX-512 a float32 kernel computes x·Φ(x) from a Chebyshev fit of erfc
// (relative error ~1e-6 in both tails; 60× faster than the float64 math.Erf
// loop, which runs on other ISAs and on the last few elements).
func GELUErfForward(out, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := geluErfForwardVec(out[lo:hi], inp[lo:hi])
		geluErfForwardGo(out[lo+n:hi], inp[lo+n:hi])
	})
}

// geluErfForwardGo is GELUErfForward's float64 loop (other ISAs, tails).
func geluErfForwardGo(out, inp []float32) {
	for i, v := range inp {
		x := float64(v)
		out[i] = float32(0.5 * x * (1 + math.Erf(x/math.Sqrt2)))
	}
}

// GELUErfBackward accumulates dinp += dout * (Φ(x) + x·φ(x)).
func GELUErfBackward(dinp, dout, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := geluErfBackwardVec(dinp[lo:hi], dout[lo:hi], inp[lo:hi])
		geluErfBackwardGo(dinp[lo+n:hi], dout[lo+n:hi], inp[lo+n:hi])
	})
}

// geluErfBackwardGo is GELUErfBackward's float64 loop (other ISAs, tails).
func geluErfBackwardGo(dinp, dout, inp []float32) {
	for i, x := range inp {
		dinp[i] += dout[i] * float32(geluErfGrad(float64(x)))
	}
}

func geluErfGrad(x float64) float64 {
	const invSqrt2Pi = 0.3989422804014327
	return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*invSqrt2Pi*math.Exp(-0.5*x*x)
}

// parallel16 is Parallel with chunk boundaries at multiples of 16 elements,
// so the vector kernels cover every chunk but the last whole and only the
// final n%16 elements take the scalar path: which element is computed by
// which path (their results differ in the last bits) does not depend on
// the thread count, and neither do the activations.
func parallel16(n, grain int, fn func(lo, hi int)) {
	Parallel((n+15)/16, max(1, grain/16), func(lo, hi int) { fn(lo*16, min(hi*16, n)) })
}

// actChunk is how many elements the activation kernels pass to the vectorised
// exp at once, through a stack buffer.
const actChunk = 256

// sigmoidOf replaces s[i] by 1/(1+exp(-s[i])): exact 0 and 1 in the tails, a
// few ulp elsewhere.
func sigmoidOf(s []float32) {
	for i := range s {
		s[i] = -s[i]
	}
	expSubF32(s, 0)
	for i := range s {
		s[i] = 1 / (1 + s[i])
	}
}

// SiLUForward computes out = x*sigmoid(x). inp, out: (any). With AVX-512 a
// fused kernel (bit-identical to siluForwardGo) does the bulk.
func SiLUForward(out, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := siluForwardVec(out[lo:hi], inp[lo:hi])
		siluForwardGo(out[lo+n:hi], inp[lo+n:hi])
	})
}

func siluForwardGo(out, inp []float32) {
	var buf [actChunk]float32
	for i0 := 0; i0 < len(inp); i0 += actChunk {
		x := inp[i0:min(i0+actChunk, len(inp))]
		s, o := buf[:len(x)], out[i0:i0+len(x)]
		copy(s, x)
		sigmoidOf(s)
		for i, v := range x {
			o[i] = v * s[i]
		}
	}
}

// SiLUBackward accumulates dinp += dout * σ(x)(1 + x(1-σ(x))).
func SiLUBackward(dinp, dout, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		n := siluBackwardVec(dinp[lo:hi], dout[lo:hi], inp[lo:hi])
		siluBackwardGo(dinp[lo+n:hi], dout[lo+n:hi], inp[lo+n:hi])
	})
}

func siluBackwardGo(dinp, dout, inp []float32) {
	var buf [actChunk]float32
	for i0 := 0; i0 < len(inp); i0 += actChunk {
		x := inp[i0:min(i0+actChunk, len(inp))]
		s, g, dx := buf[:len(x)], dout[i0:i0+len(x)], dinp[i0:i0+len(x)]
		copy(s, x)
		sigmoidOf(s)
		for i, v := range x {
			dx[i] += g[i] * s[i] * (1 + v*(1-s[i]))
		}
	}
}

// SquaredReLUForward computes out = relu(x)², Megatron's squared_relu
// (--squared-relu: torch.pow(F.relu(x), 2)). inp, out: (any).
func SquaredReLUForward(out, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		o, x := out[lo:hi], inp[lo:hi]
		for i, v := range x {
			r := max(v, 0)
			o[i] = r * r
		}
	})
}

// SquaredReLUBackward accumulates dinp += dout · 2·relu(x), the derivative
// autograd gives torch.pow(F.relu(x), 2) (0 at x = 0, as relu's).
func SquaredReLUBackward(dinp, dout, inp []float32) {
	parallel16(len(inp), actGrain, func(lo, hi int) {
		dx, g, x := dinp[lo:hi], dout[lo:hi], inp[lo:hi]
		for i, v := range x {
			dx[i] += g[i] * (2 * max(v, 0))
		}
	})
}

// SwiGLUForward computes the gated linear unit of Megatron's --swiglu.
//
//	inp: (n, 2f), each row [gate(f) | up(f)] (Megatron's linear_fc1 layout)
//	out: (n, f) = silu(gate) * up
func SwiGLUForward(out, inp []float32, n, f int) {
	Parallel(n, max(1, actGrain/(2*f+1)), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gate, up, o := inp[i*2*f:][:f], inp[i*2*f+f:][:f], out[i*f:][:f]
			k := swigluForwardVec(o, gate, up)
			swigluForwardGo(o[k:], gate[k:], up[k:])
		}
	})
}

func swigluForwardGo(out, gate, up []float32) {
	var buf [actChunk]float32
	for j0 := 0; j0 < len(gate); j0 += actChunk {
		m := min(actChunk, len(gate)-j0)
		g, u, s, o := gate[j0:][:m], up[j0:][:m], buf[:m], out[j0:][:m]
		copy(s, g)
		sigmoidOf(s)
		for j, x := range g {
			o[j] = x * s[j] * u[j]
		}
	}
}

// SwiGLUBackward accumulates the gradients of SwiGLUForward into dinp (n, 2f):
// dgate += dout*up*silu'(gate), dup += dout*silu(gate).
func SwiGLUBackward(dinp, dout, inp []float32, n, f int) {
	Parallel(n, max(1, actGrain/(2*f+1)), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gate, up, g := inp[i*2*f:][:f], inp[i*2*f+f:][:f], dout[i*f:][:f]
			dgate, dup := dinp[i*2*f:][:f], dinp[i*2*f+f:][:f]
			k := swigluBackwardVec(dgate, dup, g, gate, up)
			swigluBackwardGo(dgate[k:], dup[k:], g[k:], gate[k:], up[k:])
		}
	})
}

func swigluBackwardGo(dgate, dup, dout, gate, up []float32) {
	var buf [actChunk]float32
	for j0 := 0; j0 < len(gate); j0 += actChunk {
		m := min(actChunk, len(gate)-j0)
		x0, u, g, s := gate[j0:][:m], up[j0:][:m], dout[j0:][:m], buf[:m]
		dg, du := dgate[j0:][:m], dup[j0:][:m]
		copy(s, x0)
		sigmoidOf(s)
		for j, x := range x0 {
			dg[j] += g[j] * u[j] * s[j] * (1 + x*(1-s[j]))
			du[j] += g[j] * x * s[j]
		}
	}
}
