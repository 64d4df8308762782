//go:build !amd64

package cpu

// bf16PairKernels reports that there are no VDPBF16PS kernels off amd64.
func bf16PairKernels(ISA) (kernSet, bool) { return kernSet{}, false }

// pairRows sets d[j] = bf16(r0[j]) | bf16(r1[j])<<16 for j < len(d).
func pairRows(r0, r1 []float32, d []uint32) { pairRowsGo(r0, r1, d) }

// pairsOf sets d[q] = bf16(src[2q]) | bf16(src[2q+1])<<16 for q < len(d).
func pairsOf(src []float32, d []uint32) { pairsOfGo(src, d) }
