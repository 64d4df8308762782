//go:build !amd64

package cpu

// peakLoopFor returns the pure-Go FMA loop: assembly exists only on amd64.
func peakLoopFor(ISA) (func(n int) float32, float64) { return fmaLoopGo, 8 * 2 }
