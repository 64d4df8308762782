//go:build amd64

package cpu

// adamwAVX512 runs AdamWUpdate on the first n elements (n a multiple of
// 16). Requires AVX-512F.
//
//go:noescape
func adamwAVX512(p, gr, m, v *float32, n int, c *AdamWCoeffs)

// adamwAVX2 runs AdamWUpdate on the first n elements (n a multiple of 8).
// Requires AVX.
//
//go:noescape
func adamwAVX2(p, gr, m, v *float32, n int, c *AdamWCoeffs)

// adamwVec updates a prefix of the slices with the assembly kernel of
// ActiveISA and returns its length; the caller finishes the tail in Go.
func adamwVec(p, g, m, v []float32, c *AdamWCoeffs) int {
	var n int
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(p) >= 16:
		n = len(p) &^ 15
		adamwAVX512(&p[0], &g[0], &m[0], &v[0], n, c)
	case isa == ISAAVX2 && len(p) >= 8:
		n = len(p) &^ 7
		adamwAVX2(&p[0], &g[0], &m[0], &v[0], n, c)
	}
	return n
}
