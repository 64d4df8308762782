package cpu

import "math"

// Small vector helpers of the attention kernels.

// dotF32 returns Σ a[i]*b[i] over len(a) (b at least as long).
func dotF32(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// scaleF32 computes x *= alpha.
func scaleF32(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

// expSubGo replaces x[i] by exp(x[i]-sub) and returns their sum (pure Go).
func expSubGo(x []float32, sub float32) float32 {
	var s float32
	for i, v := range x {
		e := expF32(v - sub)
		x[i] = e
		s += e
	}
	return s
}

// expF32 is a float32 exp (Cephes expf: range reduction by ln 2, degree-6
// polynomial), within 2 ulp of the true value on [-87.3, 88.7]; below it
// returns 0 (so -Inf gives 0), above +Inf; NaN propagates.
func expF32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		c1    = 0.693359375
		c2    = -2.12194440e-4
	)
	switch {
	case x < -87.33654:
		return 0
	case x > 88.72283:
		return float32(math.Inf(1))
	case x != x:
		return x
	}
	fx := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - fx*c1 - fx*c2
	y := ((((1.9875691500e-4*r+1.3981999507e-3)*r+8.3334519073e-3)*r+4.1665795894e-2)*r+1.6666665459e-1)*r + 5.0000001201e-1
	y = y*r*r + r + 1
	return y * math.Float32frombits(uint32(int32(fx)+127)<<23)
}

// maxF32 returns max(m, x...) with eight independent running maxima, so the
// loop is not bound by the latency of one dependent chain.
func maxF32(m float32, x []float32) float32 {
	m0, m1, m2, m3, m4, m5, m6, m7 := m, m, m, m, m, m, m, m
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		m0, m1, m2, m3 = max(m0, v[0]), max(m1, v[1]), max(m2, v[2]), max(m3, v[3])
		m4, m5, m6, m7 = max(m4, v[4]), max(m5, v[5]), max(m6, v[6]), max(m7, v[7])
	}
	for ; i < len(x); i++ {
		m0 = max(m0, x[i])
	}
	return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
}

// zigzag maps position p of 0..n-1 to block 0, n-1, 1, n-2, ...: with causal
// masks block cost grows (or shrinks) with the index, so this order gives every
// contiguous range Parallel hands a goroutine a balanced share of work.
func zigzag(p, n int) int {
	if p%2 == 0 {
		return p / 2
	}
	return n - 1 - p/2
}
