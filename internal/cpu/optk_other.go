//go:build !amd64

package cpu

// nonFiniteVec leaves every element to the pure-Go path off amd64.
func nonFiniteVec(x []float32) (int, bool) { return 0, false }
