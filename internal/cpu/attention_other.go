//go:build !amd64

package cpu

// expSubF32 replaces x[i] by exp(x[i]-sub) and returns their sum.
func expSubF32(x []float32, sub float32) float32 { return expSubGo(x, sub) }
