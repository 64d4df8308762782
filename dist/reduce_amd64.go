package dist

import "golang.org/x/sys/cpu"

//go:noescape
func addF32AVX2(d, s *float32, n int)

// hasAVX2 is fixed at start-up by the CPU; it is not configuration.
var hasAVX2 = cpu.X86.HasAVX2

// addF32 sets d[i] += s[i] for i < len(d) (len(s) ≥ len(d)).
func addF32(d, s []float32) {
	if len(d) == 0 {
		return
	}
	s = s[:len(d)]
	if hasAVX2 {
		addF32AVX2(&d[0], &s[0], len(d))
		return
	}
	addF32Ref(d, s)
}
