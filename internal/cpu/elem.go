package cpu

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
