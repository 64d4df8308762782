package cpu

import "golang.org/x/sys/cpu"

// bf16PairKernels returns the VDPBF16PS kernel set when isa is avx512 and
// the CPU has AVX512_BF16 (and AVX-512F). The tile is the fp32 AVX-512
// set's (14×32); kc counts k steps, and since a pair packs two steps in
// one word, kc = 1024 keeps the fp32 set's panel bytes (a 64 KiB B strip,
// a 56 KiB A panel). Measured on Zen 4, one thread, 1024³: kc 512 gives
// 185 GFLOP/cpu-s, kc 1024 196.
func bf16PairKernels(isa ISA) (kernSet, bool) {
	if isa != ISAAVX512 || !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BF16 {
		return kernSet{}, false
	}
	return kernSet{mr: mrAVX512, nr: nrAVX512, kerns: kernsBF16AVX512[:], mc: 10 * mrAVX512, kc: 1024, nc: 1536,
		bf16: packPairs}, true
}

// pairRows sets d[j] = bf16(r0[j]) | bf16(r1[j])<<16 for j < len(d). It
// runs only with the pair kernels, hence on a CPU with AVX-512F.
func pairRows(r0, r1 []float32, d []uint32) {
	n := len(d)
	if n == 0 {
		return
	}
	_, _ = r0[n-1], r1[n-1]
	bf16PairRowsAVX512(&r0[0], &r1[0], &d[0], n)
}

// pairsOf sets d[q] = bf16(src[2q]) | bf16(src[2q+1])<<16 for q < len(d).
func pairsOf(src []float32, d []uint32) {
	n := len(d)
	if n == 0 {
		return
	}
	_ = src[2*n-1]
	m := n &^ 15
	if m > 0 {
		bf16PairsAVX512(&src[0], &d[0], m)
	}
	for q := m; q < n; q++ {
		d[q] = pairBits(src[2*q], src[2*q+1])
	}
}
