package cpu

import "golang.org/x/sys/cpu"

// detectISA reports AVX-512F when the CPU and OS (XSAVE of the Z state)
// support it, else AVX2 with FMA3, else the pure-Go path.
func detectISA() ISA {
	switch {
	case cpu.X86.HasAVX512F:
		return ISAAVX512
	case cpu.X86.HasAVX2 && cpu.X86.HasFMA:
		return ISAAVX2
	}
	return ISAGeneric
}
