package cpu

import "math"

// The *Ref kernels are the float64 specifications of the fast kernels: plain
// loops, one row at a time, no parallelism. Tests hold the float32 kernels to
// them and check their gradients by finite differences. Shapes and the
// accumulate contract are those of the matching fast kernel.

// layerNormForwardRef is the reference for LayerNormForward.
func layerNormForwardRef(out, mean, rstd, inp, weight, bias []float64, n, c int, eps float64) {
	for i := 0; i < n; i++ {
		x := inp[i*c : i*c+c]
		m := 0.0
		for _, v := range x {
			m += v
		}
		m /= float64(c)
		v2 := 0.0
		for _, v := range x {
			v2 += (v - m) * (v - m)
		}
		r := 1 / math.Sqrt(v2/float64(c)+eps)
		for j, v := range x {
			y := (v - m) * r * weight[j]
			if bias != nil {
				y += bias[j]
			}
			out[i*c+j] = y
		}
		mean[i], rstd[i] = m, r
	}
}

// layerNormBackwardRef is the reference for LayerNormBackward.
func layerNormBackwardRef(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float64, n, c int) {
	for i := 0; i < n; i++ {
		x, g := inp[i*c:i*c+c], dout[i*c:i*c+c]
		m, r := mean[i], rstd[i]
		dmean, dnormMean := 0.0, 0.0
		for j := range x {
			dmean += weight[j] * g[j]
			dnormMean += weight[j] * g[j] * (x[j] - m) * r
		}
		dmean /= float64(c)
		dnormMean /= float64(c)
		for j := range x {
			xh := (x[j] - m) * r
			dinp[i*c+j] += (weight[j]*g[j] - dmean - xh*dnormMean) * r
			dweight[j] += g[j] * xh
			if dbias != nil {
				dbias[j] += g[j]
			}
		}
	}
}

// rmsNormForwardRef is the reference for RMSNormForward.
func rmsNormForwardRef(out, rstd, inp, weight []float64, n, c int, eps float64) {
	for i := 0; i < n; i++ {
		x := inp[i*c : i*c+c]
		s := 0.0
		for _, v := range x {
			s += v * v
		}
		r := 1 / math.Sqrt(s/float64(c)+eps)
		for j, v := range x {
			out[i*c+j] = v * r * weight[j]
		}
		rstd[i] = r
	}
}

// rmsNormBackwardRef is the reference for RMSNormBackward.
func rmsNormBackwardRef(dinp, dweight, dout, inp, weight, rstd []float64, n, c int) {
	for i := 0; i < n; i++ {
		x, g := inp[i*c:i*c+c], dout[i*c:i*c+c]
		r := rstd[i]
		dot := 0.0
		for j := range x {
			dot += weight[j] * g[j] * x[j]
		}
		for j := range x {
			dinp[i*c+j] += r * (weight[j]*g[j] - x[j]*r*r*dot/float64(c))
			dweight[j] += g[j] * x[j] * r
		}
	}
}
