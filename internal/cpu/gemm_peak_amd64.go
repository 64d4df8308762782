package cpu

// peakLoopFor returns the FMA loop FMAPeak times for isa and the FLOPs of
// one of its iterations (accumulators × lanes × 2).
func peakLoopFor(isa ISA) (func(n int) float32, float64) {
	switch isa {
	case ISAAVX512:
		return fmaLoopAVX512, 24 * 16 * 2
	case ISAAVX2:
		return fmaLoopAVX2, 12 * 8 * 2
	}
	return fmaLoopGo, 8 * 2
}

// fmaLoopAVX512 runs n iterations of 24 independent zmm FMAs (1·1 added to
// each accumulator) and returns 24·n (gen/peak.go).
//
//go:noescape
func fmaLoopAVX512(n int) float32

// fmaLoopAVX2 runs n iterations of 12 independent ymm FMAs and returns
// 12·n (gen/peak.go).
//
//go:noescape
func fmaLoopAVX2(n int) float32
