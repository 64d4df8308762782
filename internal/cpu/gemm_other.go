//go:build !amd64

package cpu

// kernelsFor returns the pure-Go kernel set: assembly exists only on amd64.
func kernelsFor(ISA) kernSet { return genericKernels() }
