package cpu

import "math"

// actGrain is the minimum number of elements one goroutine takes in the
// elementwise kernels.
const actGrain = 1 << 14

// geluTanhK is sqrt(2/pi), the constant of the tanh approximation.
const geluTanhK = 0.7978845608028654

// GELUTanhForward computes out = 0.5*x*(1+tanh(sqrt(2/π)*(x+0.044715x³))),
// torch's gelu(approximate="tanh") and Megatron's bias_gelu. inp, out: (any).
// It evaluates the identical x*sigmoid(2u) in float32 with one exp, accurate to
// a few ulp (no cancellation in 1+tanh for negative x).
func GELUTanhForward(out, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			out[i] = x * sigmoidF32(2*geluTanhK*(x+0.044715*x*x*x))
		}
	})
}

// GELUTanhBackward accumulates dinp += dout * d/dx GELUTanh(inp)
// = dout * (s + 2x·s(1-s)·sqrt(2/π)(1+3·0.044715x²)), s = sigmoid(2u).
func GELUTanhBackward(dinp, dout, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			s := sigmoidF32(2 * geluTanhK * (x + 0.044715*x*x*x))
			dinp[i] += dout[i] * (s + 2*x*s*(1-s)*geluTanhK*(1+3*0.044715*x*x))
		}
	})
}

// geluTanhGrad is the float64 derivative of the tanh-form GELU (references).
func geluTanhGrad(x float64) float64 {
	u := geluTanhK * (x + 0.044715*x*x*x)
	t := math.Tanh(u)
	sech2 := 1 - t*t
	return 0.5*(1+t) + 0.5*x*sech2*geluTanhK*(1+3*0.044715*x*x)
}

// GELUErfForward computes the exact GELU out = 0.5*x*(1+erf(x/√2)), torch's
// default F.gelu. inp, out: (any).
func GELUErfForward(out, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := float64(inp[i])
			out[i] = float32(0.5 * x * (1 + math.Erf(x/math.Sqrt2)))
		}
	})
}

// GELUErfBackward accumulates dinp += dout * (Φ(x) + x·φ(x)).
func GELUErfBackward(dinp, dout, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dinp[i] += dout[i] * float32(geluErfGrad(float64(inp[i])))
		}
	})
}

func geluErfGrad(x float64) float64 {
	const invSqrt2Pi = 0.3989422804014327
	return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*invSqrt2Pi*math.Exp(-0.5*x*x)
}

// sigmoidF32 is 1/(1+e^-x) in float32: exact 0 and 1 in the tails, a few ulp
// elsewhere.
func sigmoidF32(x float32) float32 { return 1 / (1 + expF32(-x)) }

// SiLUForward computes out = x*sigmoid(x). inp, out: (any).
func SiLUForward(out, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			out[i] = x * sigmoidF32(x)
		}
	})
}

// SiLUBackward accumulates dinp += dout * σ(x)(1 + x(1-σ(x))).
func SiLUBackward(dinp, dout, inp []float32) {
	Parallel(len(inp), actGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i]
			s := sigmoidF32(x)
			dinp[i] += dout[i] * s * (1 + x*(1-s))
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
			gate, up, o := inp[i*2*f:i*2*f+f], inp[i*2*f+f:i*2*f+2*f], out[i*f:i*f+f]
			for j := range o {
				x := gate[j]
				o[j] = x * sigmoidF32(x) * up[j]
			}
		}
	})
}

// SwiGLUBackward accumulates the gradients of SwiGLUForward into dinp (n, 2f):
// dgate += dout*up*silu'(gate), dup += dout*silu(gate).
func SwiGLUBackward(dinp, dout, inp []float32, n, f int) {
	Parallel(n, max(1, actGrain/(2*f+1)), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gate, up, g := inp[i*2*f:i*2*f+f], inp[i*2*f+f:i*2*f+2*f], dout[i*f:i*f+f]
			dgate, dup := dinp[i*2*f:i*2*f+f], dinp[i*2*f+f:i*2*f+2*f]
			for j := range g {
				x := gate[j]
				s := sigmoidF32(x)
				dgate[j] += g[j] * up[j] * s * (1 + x*(1-s))
				dup[j] += g[j] * x * s
			}
		}
	})
}
