package cpu

import "golang.org/x/sys/cpu"

// bf16PairKernels returns the VDPBF16PS kernel set when isa is avx512 and
// the CPU has AVX512_BF16 (and AVX-512F). The tile and blocking are the
// fp32 AVX-512 set's, with kc counted in k steps (a B strip of kc steps
// holds kc/2 pair rows, so twice the k of an fp32 strip fits in L1).
func bf16PairKernels(isa ISA) (kernSet, bool) {
	if isa != ISAAVX512 || !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BF16 {
		return kernSet{}, false
	}
	return kernSet{mr: mrAVX512, nr: nrAVX512, kerns: kernsBF16AVX512[:], mc: 10 * mrAVX512, kc: 512, nc: 1536,
		bf16: packPairs}, true
}
