package cpu

// NonFinite reports whether x holds a NaN or ±Inf (the found_inf check of
// mixed-precision training), with the AVX-512 or AVX2 kernel per ActiveISA.
func NonFinite(x []float32) bool {
	k, bad := nonFiniteVec(x)
	return bad || nonFiniteGo(x[k:])
}

// nonFiniteGo is the pure-Go path and reference: x·0 is ±0 for finite x and
// NaN otherwise, so one branch-free pass suffices (a sum of ±0 is ±0, which
// compares equal to 0).
func nonFiniteGo(x []float32) bool {
	var acc float32
	for _, v := range x {
		acc += v * 0
	}
	return acc != 0
}
