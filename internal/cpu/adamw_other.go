//go:build !amd64

package cpu

// adamwVec leaves every element to the pure-Go path off amd64.
func adamwVec(p, g, m, v []float32, c *AdamWCoeffs) int { return 0 }
