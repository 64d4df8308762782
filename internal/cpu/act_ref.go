package cpu

import "math"

// geluTanhForwardRef is the reference for GELUTanhForward.
func geluTanhForwardRef(out, inp []float64) {
	for i, x := range inp {
		out[i] = 0.5 * x * (1 + math.Tanh(geluTanhK*(x+0.044715*x*x*x)))
	}
}

// geluTanhBackwardRef is the reference for GELUTanhBackward.
func geluTanhBackwardRef(dinp, dout, inp []float64) {
	for i, x := range inp {
		dinp[i] += dout[i] * geluTanhGrad(x)
	}
}

// geluErfForwardRef is the reference for GELUErfForward.
func geluErfForwardRef(out, inp []float64) {
	for i, x := range inp {
		out[i] = 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
	}
}

// geluErfBackwardRef is the reference for GELUErfBackward.
func geluErfBackwardRef(dinp, dout, inp []float64) {
	for i, x := range inp {
		dinp[i] += dout[i] * geluErfGrad(x)
	}
}

// siluForwardRef is the reference for SiLUForward.
func siluForwardRef(out, inp []float64) {
	for i, x := range inp {
		out[i] = x / (1 + math.Exp(-x))
	}
}

// siluBackwardRef is the reference for SiLUBackward.
func siluBackwardRef(dinp, dout, inp []float64) {
	for i, x := range inp {
		s := 1 / (1 + math.Exp(-x))
		dinp[i] += dout[i] * s * (1 + x*(1-s))
	}
}

// squaredReLUForwardRef is the reference for SquaredReLUForward.
func squaredReLUForwardRef(out, inp []float64) {
	for i, x := range inp {
		r := math.Max(x, 0)
		out[i] = r * r
	}
}

// squaredReLUBackwardRef is the reference for SquaredReLUBackward.
func squaredReLUBackwardRef(dinp, dout, inp []float64) {
	for i, x := range inp {
		dinp[i] += dout[i] * 2 * math.Max(x, 0)
	}
}

// swigluForwardRef is the reference for SwiGLUForward.
func swigluForwardRef(out, inp []float64, n, f int) {
	for i := 0; i < n; i++ {
		for j := 0; j < f; j++ {
			x, u := inp[i*2*f+j], inp[i*2*f+f+j]
			out[i*f+j] = x / (1 + math.Exp(-x)) * u
		}
	}
}

// swigluBackwardRef is the reference for SwiGLUBackward.
func swigluBackwardRef(dinp, dout, inp []float64, n, f int) {
	for i := 0; i < n; i++ {
		for j := 0; j < f; j++ {
			x, u, g := inp[i*2*f+j], inp[i*2*f+f+j], dout[i*f+j]
			s := 1 / (1 + math.Exp(-x))
			dinp[i*2*f+j] += g * u * s * (1 + x*(1-s))
			dinp[i*2*f+f+j] += g * x * s
		}
	}
}
