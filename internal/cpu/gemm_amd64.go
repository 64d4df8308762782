package cpu

// kernelsFor returns the kernel set of isa (clamped by SetISA to what the
// CPU supports). Blocking is tuned on Zen 4 / Sapphire Rapids class cores
// (32–48 KiB L1d, 1–2 MiB L2): see docs/design/gemm.md.
func kernelsFor(isa ISA) kernSet {
	switch isa {
	case ISAAVX512:
		return kernSet{mr: mrAVX512, nr: nrAVX512, kerns: kernsAVX512[:], mc: 10 * mrAVX512, kc: 512, nc: 1536,
			trMR: trMRAVX512, cpMR: cpMRAVX512, dots: dotsAVX512[:], tr16: transposeAVX512_16x16,
			strips: packStripsAVX512, wide: kernsWideAVX512[:],
			pair: kernPairAVX512_1x64, pairWide: kernPairWideAVX512_1x64}
	case ISAAVX2:
		return kernSet{mr: mrAVX2, nr: nrAVX2, kerns: kernsAVX2[:], mc: 24 * mrAVX2, kc: 384, nc: 3072, wide: kernsWideAVX2[:],
			pair: kernPairAVX2_1x32, pairWide: kernPairWideAVX2_1x32}
	}
	return genericKernels()
}

// transpose16 is kernSet.tr16 on AVX-512 (the only kernel set that has
// one), called directly so that a scratch block on the caller's stack
// does not escape.
func transpose16(src *float32, lds int, dst *[256]float32) {
	transposeAVX512_16x16(src, lds, &dst[0], 16*4)
}
