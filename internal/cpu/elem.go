package cpu

import (
	"fmt"
	"math"
)

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

// Axpys adds w[j]·x[j·ldx+i] to y[i] for j = 0, 1, …, len(w)-1 in that
// order and i < len(y): the same bits as Axpy(y, x[j·ldx:][:len(y)], w[j])
// for each j in turn, in one call (attention weights values this way, one
// row per cached position). Rows may overlap (ldx ≥ 0).
func Axpys(y, x []float32, ldx int, w []float32) {
	d, n := len(y), len(w)
	if n == 0 || d == 0 {
		return
	}
	if ldx < 0 || len(x) < (n-1)*ldx+d {
		panic(fmt.Sprintf("cpu: Axpys: %d rows of %d at stride %d need %d values, have %d", n, d, ldx, (n-1)*ldx+d, len(x)))
	}
	if axpysVec(y, x, ldx, w) {
		return
	}
	for j, a := range w {
		Axpy(y, x[j*ldx:][:d], a)
	}
}

// SoftmaxWeights sets w[j] = float32(exp(sc[j]-m)/Σ exp(sc[i]-m)), m the
// largest score: attention weights from float64 scores, as both of
// decoding's attention paths (gpt's cached attention, infer's paged
// attention) compute them, so that they agree bit for bit. sc is
// overwritten with the exponentials. A NaN score makes every weight NaN.
func SoftmaxWeights(w []float32, sc []float64) {
	w = w[:len(sc)]
	mx := math.Inf(-1)
	for _, v := range sc {
		if v > mx { // math.Max's NaN and signed-zero cases change no weight
			mx = v
		}
	}
	var sum float64
	for j, v := range sc {
		e := math.Exp(v - mx)
		sc[j] = e
		sum += e
	}
	for j, v := range sc {
		w[j] = float32(v / sum)
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

// DotsF64 sets out[j] = DotF64(q, k[j·ldk:][:len(q)])·scale for j <
// len(out), with the same bits, in one call (attention scores a query
// against one cached key per row).
func DotsF64(out []float64, q, k []float32, ldk int, scale float64) {
	d, n := len(q), len(out)
	if n == 0 {
		return
	}
	if ldk < 0 || len(k) < (n-1)*ldk+d {
		panic(fmt.Sprintf("cpu: DotsF64: %d keys of %d at stride %d need %d values, have %d", n, d, ldk, (n-1)*ldk+d, len(k)))
	}
	if d > 0 && dotsF64Vec(out, q, k, ldk, scale) {
		return
	}
	for j := range out {
		out[j] = DotF64(q, k[j*ldk:][:d]) * scale
	}
}
