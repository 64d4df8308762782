//go:build !amd64

package cpu

// kernelsFor returns the pure-Go kernel set: assembly exists only on amd64.
func kernelsFor(ISA) kernSet { return genericKernels() }

// transpose16 is never called here: no kernel set of this architecture
// has a 16×16 transpose.
func transpose16(src *float32, lds int, dst *[256]float32) {
	panic("cpu: transpose16 without AVX-512")
}
