package cpu

import "math"

// Axpy adds a*x[i] to y[i] (y at least as long as x), multiplying then
// adding in float32 like the plain loop, so every ISA gives the same bits.
// It runs on the calling goroutine: callers split large work themselves.
func Axpy(y, x []float32, a float32) {
	y = y[:len(x)]
	n := axpyVec(y, x, a)
	for i := n; i < len(x); i++ {
		y[i] += a * x[i]
	}
}

// Add sets out[i] = a[i] + b[i] for i < len(a) (out and b at least as long;
// out may alias a or b), on the calling goroutine.
func Add(out, a, b []float32) {
	out, b = out[:len(a)], b[:len(a)]
	for i := addVec(out, a, b); i < len(a); i++ {
		out[i] = a[i] + b[i]
	}
}

// dotLanes is the number of float64 partial sums DotF64 keeps.
const dotLanes = 16

// DotF64 returns Σ a[i]·b[i] (b at least as long as a) accumulated in
// float64: element i is fused-multiply-added into partial sum i mod 16,
// and the 16 partial sums are added in order. That order is fixed, so
// every ISA (vector kernel or this Go loop) gives the same bits; decoding
// (gpt's cached attention and infer's paged attention) relies on it to
// compute the same scores.
func DotF64(a, b []float32) float64 {
	b = b[:len(a)]
	var acc [dotLanes]float64
	for i := dotF64Vec(a, b, &acc); i < len(a); i++ {
		acc[i%dotLanes] = math.FMA(float64(a[i]), float64(b[i]), acc[i%dotLanes])
	}
	var s float64
	for _, v := range acc {
		s += v
	}
	return s
}
