//go:build amd64

package cpu

// nonFiniteAVX512 reports whether x[:n] (n a multiple of 16) holds a NaN or
// ±Inf. Requires AVX-512F.
//
//go:noescape
func nonFiniteAVX512(x *float32, n int) bool

// nonFiniteAVX2 reports whether x[:n] (n a multiple of 8) holds a NaN or
// ±Inf. Requires AVX.
//
//go:noescape
func nonFiniteAVX2(x *float32, n int) bool

// nonFiniteVec checks a prefix of x with the kernel of ActiveISA and
// returns its length and whether it holds a NaN or ±Inf.
func nonFiniteVec(x []float32) (int, bool) {
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(x) >= 16:
		n := len(x) &^ 15
		return n, nonFiniteAVX512(&x[0], n)
	case isa == ISAAVX2 && len(x) >= 8:
		n := len(x) &^ 7
		return n, nonFiniteAVX2(&x[0], n)
	}
	return 0, false
}
