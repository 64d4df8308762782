package cpu

import "math"

// Gradient contract for every backward kernel in this package (llm.c style):
// backward ACCUMULATES (+=) into dinp and into parameter gradients (dweight,
// dbias), so the caller zeroes gradients once per step and residual branches
// sum for free. The one exception is CrossEntropyBackward, which overwrites
// dlogits (and may run in place over the logits).
//
// Parameter-gradient reductions over rows (dweight, dbias) are split over
// columns, not rows, so results do not depend on Threads().

// normGrain is the minimum number of rows (or columns) one goroutine takes.
const normGrain = 16

// LayerNormForward normalises each row of inp and applies weight and bias.
//
//	inp, out: (n, c); weight, bias: (c), bias may be nil
//	mean, rstd: (n), cached for LayerNormBackward
//
// out[i,j] = (inp[i,j]-mean[i])*rstd[i]*weight[j] + bias[j], with
// rstd = 1/sqrt(var + eps) and the biased (1/c) variance, as torch.nn.LayerNorm.
// Row reductions accumulate in float64 (two passes: mean, then variance).
func LayerNormForward(out, mean, rstd, inp, weight, bias []float32, n, c int, eps float32) {
	Parallel(n, normGrain, func(lo, hi int) {
		i := lo
		for ; i+4 <= hi; i += 4 {
			// Four rows' sums at once: four independent float64 chains
			// (each row's in the same order as alone), so the adds'
			// latency overlaps instead of serialising every row.
			x0, x1, x2, x3 := inp[i*c:][:c], inp[(i+1)*c:][:c], inp[(i+2)*c:][:c], inp[(i+3)*c:][:c]
			var s0, s1, s2, s3 float64
			for j := range x0 {
				s0 += float64(x0[j])
				s1 += float64(x1[j])
				s2 += float64(x2[j])
				s3 += float64(x3[j])
			}
			m0, m1, m2, m3 := float32(s0/float64(c)), float32(s1/float64(c)), float32(s2/float64(c)), float32(s3/float64(c))
			var v0, v1, v2, v3 float64
			for j := range x0 {
				d0, d1, d2, d3 := float64(x0[j]-m0), float64(x1[j]-m1), float64(x2[j]-m2), float64(x3[j]-m3)
				v0 += d0 * d0
				v1 += d1 * d1
				v2 += d2 * d2
				v3 += d3 * d3
			}
			layerNormApply(out, mean, rstd, inp, weight, bias, i, c, m0, v0, eps)
			layerNormApply(out, mean, rstd, inp, weight, bias, i+1, c, m1, v1, eps)
			layerNormApply(out, mean, rstd, inp, weight, bias, i+2, c, m2, v2, eps)
			layerNormApply(out, mean, rstd, inp, weight, bias, i+3, c, m3, v3, eps)
		}
		for ; i < hi; i++ {
			m, v2 := layerNormStats(inp[i*c : i*c+c])
			layerNormApply(out, mean, rstd, inp, weight, bias, i, c, m, v2, eps)
		}
	})
}

// layerNormStats returns a row's mean and sum of squared deviations, in
// float64 in column order (the four-row path computes each row the same).
func layerNormStats(x []float32) (m float32, v2 float64) {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	m = float32(s / float64(len(x)))
	for _, v := range x {
		d := float64(v - m)
		v2 += d * d
	}
	return m, v2
}

// layerNormApply writes row i of LayerNormForward given its mean m and sum
// of squared deviations v2.
func layerNormApply(out, mean, rstd, inp, weight, bias []float32, i, c int, m float32, v2 float64, eps float32) {
	x := inp[i*c : i*c+c]
	r := float32(1 / math.Sqrt(v2/float64(c)+float64(eps)))
	o := out[i*c : i*c+c]
	w := weight[:c]
	if bias == nil {
		for j, v := range x {
			o[j] = (v - m) * r * w[j]
		}
	} else {
		b := bias[:c]
		for j, v := range x {
			o[j] = (v-m)*r*w[j] + b[j]
		}
	}
	mean[i], rstd[i] = m, r
}

// LayerNormBackward accumulates the gradients of LayerNormForward.
//
//	dout, inp, dinp: (n, c); weight, dweight, dbias: (c), dbias may be nil
//	mean, rstd: (n) from LayerNormForward
//
// dinp += rstd*(w*dout - mean(w*dout) - xhat*mean(w*dout*xhat)),
// dweight += Σ_rows dout*xhat, dbias += Σ_rows dout.
func LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, n, c int) {
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x, g, dx := inp[i*c:i*c+c], dout[i*c:i*c+c], dinp[i*c:i*c+c]
			m, r := mean[i], rstd[i]
			var sm, snm float64
			for j := range x {
				wg := weight[j] * g[j]
				sm += float64(wg)
				snm += float64(wg * (x[j] - m))
			}
			dmean := float32(sm / float64(c))
			dnormMean := float32(snm / float64(c) * float64(r))
			for j := range x {
				xh := (x[j] - m) * r
				dx[j] += (weight[j]*g[j] - dmean - xh*dnormMean) * r
			}
		}
	})
	Parallel(c, normGrain, func(lo, hi int) {
		for i := 0; i < n; i++ {
			x, g := inp[i*c:i*c+c], dout[i*c:i*c+c]
			m, r := mean[i], rstd[i]
			for j := lo + lnParamGradVec(dweight[lo:hi], g[lo:hi], x[lo:hi], m, r); j < hi; j++ {
				dweight[j] += g[j] * (x[j] - m) * r
			}
			if dbias != nil {
				Axpy(dbias[lo:hi], g[lo:hi], 1)
			}
		}
	})
}

// RMSNormForward scales each row by its reciprocal root mean square.
//
//	inp, out: (n, c); weight: (c); rstd: (n), cached for RMSNormBackward
//
// out[i,j] = inp[i,j]*rstd[i]*weight[j], rstd = 1/sqrt(mean(inp²) + eps)
// (Megatron/Llama RMSNorm).
func RMSNormForward(out, rstd, inp, weight []float32, n, c int, eps float32) {
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := inp[i*c : i*c+c]
			var s float64
			for _, v := range x {
				s += float64(v) * float64(v)
			}
			r := float32(1 / math.Sqrt(s/float64(c)+float64(eps)))
			o := out[i*c : i*c+c]
			for j, v := range x {
				o[j] = v * r * weight[j]
			}
			rstd[i] = r
		}
	})
}

// RMSNormBackward accumulates the gradients of RMSNormForward.
//
//	dout, inp, dinp: (n, c); weight, dweight: (c); rstd: (n) from the forward
//
// dinp += rstd*(w*dout - x*rstd²*mean(w*dout*x)), dweight += Σ_rows dout*x*rstd.
func RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []float32, n, c int) {
	Parallel(n, normGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x, g, dx := inp[i*c:i*c+c], dout[i*c:i*c+c], dinp[i*c:i*c+c]
			r := rstd[i]
			var dot float64
			for j := range x {
				dot += float64(weight[j] * g[j] * x[j])
			}
			k := float32(float64(r) * float64(r) * dot / float64(c))
			for j := range x {
				dx[j] += r * (weight[j]*g[j] - x[j]*k)
			}
		}
	})
	Parallel(c, normGrain, func(lo, hi int) {
		for i := 0; i < n; i++ {
			x, g := inp[i*c:i*c+c], dout[i*c:i*c+c]
			r := rstd[i]
			for j := lo; j < hi; j++ {
				dweight[j] += g[j] * x[j] * r
			}
		}
	})
}
