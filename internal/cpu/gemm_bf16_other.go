//go:build !amd64

package cpu

// bf16PairKernels reports that there are no VDPBF16PS kernels off amd64.
func bf16PairKernels(ISA) (kernSet, bool) { return kernSet{}, false }
