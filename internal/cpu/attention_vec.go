package cpu

import "math"

// Small vector helpers of the attention kernels (pure Go; the compiler does not
// vectorise them, so they are unrolled by 4 for independent accumulators).

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

// axpyF32 computes y += alpha*x over len(x).
func axpyF32(alpha float32, x, y []float32) {
	y = y[:len(x)]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		y[i] += alpha * x[i]
		y[i+1] += alpha * x[i+1]
		y[i+2] += alpha * x[i+2]
		y[i+3] += alpha * x[i+3]
	}
	for ; i < len(x); i++ {
		y[i] += alpha * x[i]
	}
}

// scaleF32 computes x *= alpha.
func scaleF32(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

// expF32 is exp in float32 (through float64, so correctly rounded in practice).
func expF32(x float32) float32 { return float32(math.Exp(float64(x))) }
