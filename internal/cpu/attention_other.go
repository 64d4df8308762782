//go:build !amd64

package cpu

// expSubF32 replaces x[i] by exp(x[i]-sub) and returns their sum.
func expSubF32(x []float32, sub float32) float32 { return expSubGo(x, sub) }

// expSumF32 returns Σ exp(x[i]-sub).
func expSumF32(x []float32, sub float32) float32 {
	var s float32
	for _, v := range x {
		s += expF32(v - sub)
	}
	return s
}

// maxRowF32 returns max(m, x...).
func maxRowF32(m float32, x []float32) float32 { return maxF32(m, x) }
