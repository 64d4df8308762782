package cpu

import "math"

// SoftmaxForward computes a numerically stable softmax of each row.
//
//	inp, out: (n, c); out[i,:] = exp(inp[i,:]-max)/Σ exp(inp[i,:]-max)
//
// out is cached for SoftmaxBackward. out may alias inp. exp runs in float32
// (AVX-512 or AVX2 per ActiveISA, within 2 ulp of exp).
func SoftmaxForward(out, inp []float32, n, c int) {
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x, o := inp[i*c:i*c+c], out[i*c:i*c+c]
			m := maxRowF32(float32(math.Inf(-1)), x)
			copy(o, x) // no-op when out aliases inp
			inv := 1 / expSubF32(o, m)
			for j := range o {
				o[j] *= inv
			}
		}
	})
}

// SoftmaxBackward accumulates dinp += out*(dout - Σ_j dout*out), the gradient
// of SoftmaxForward given its output. dinp, dout, out: (n, c).
func SoftmaxBackward(dinp, dout, out []float32, n, c int) {
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g, y, dx := dout[i*c:i*c+c], out[i*c:i*c+c], dinp[i*c:i*c+c]
			var dot float32
			for j := range g {
				dot += g[j] * y[j]
			}
			for j := range g {
				dx[j] += y[j] * (g[j] - dot)
			}
		}
	})
}

// softmaxForwardRef is the reference for SoftmaxForward.
func softmaxForwardRef(out, inp []float64, n, c int) {
	for i := 0; i < n; i++ {
		m := math.Inf(-1)
		for _, v := range inp[i*c : i*c+c] {
			m = math.Max(m, v)
		}
		s := 0.0
		for j := 0; j < c; j++ {
			out[i*c+j] = math.Exp(inp[i*c+j] - m)
			s += out[i*c+j]
		}
		for j := 0; j < c; j++ {
			out[i*c+j] /= s
		}
	}
}

// softmaxBackwardRef is the reference for SoftmaxBackward.
func softmaxBackwardRef(dinp, dout, out []float64, n, c int) {
	for i := 0; i < n; i++ {
		dot := 0.0
		for j := 0; j < c; j++ {
			dot += dout[i*c+j] * out[i*c+j]
		}
		for j := 0; j < c; j++ {
			dinp[i*c+j] += out[i*c+j] * (dout[i*c+j] - dot)
		}
	}
}
