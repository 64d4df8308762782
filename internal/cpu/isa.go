package cpu

import (
	"fmt"
	"sync/atomic"
)

// ISA names an instruction-set path of the SGEMM kernels.
type ISA int

const (
	// ISAGeneric is the pure-Go path; it runs everywhere.
	ISAGeneric ISA = iota
	// ISAAVX2 uses AVX2+FMA3 assembly on 256-bit Y registers.
	ISAAVX2
	// ISAAVX512 uses AVX-512F assembly on all 32 Z registers.
	ISAAVX512
)

// String returns the ISA's name as the --isa flag spells it.
func (i ISA) String() string {
	switch i {
	case ISAGeneric:
		return "generic"
	case ISAAVX2:
		return "avx2"
	case ISAAVX512:
		return "avx512"
	}
	return fmt.Sprintf("ISA(%d)", int(i))
}

// ParseISA turns "generic", "avx2", "avx512" or "auto" (the detected ISA)
// into an ISA.
func ParseISA(s string) (ISA, error) {
	switch s {
	case "generic":
		return ISAGeneric, nil
	case "avx2":
		return ISAAVX2, nil
	case "avx512":
		return ISAAVX512, nil
	case "auto", "":
		return DetectedISA(), nil
	}
	return 0, fmt.Errorf("cpu: unknown ISA %q (want generic, avx2, avx512 or auto)", s)
}

// activeISA is the ISA kernels use. Like Threads it is process state by
// nature: set from DetectedISA at start-up, changed only through SetISA.
var activeISA atomic.Int32

func init() { activeISA.Store(int32(DetectedISA())) }

// DetectedISA returns the best ISA this CPU and OS support.
func DetectedISA() ISA { return detectISA() }

// ActiveISA returns the ISA the kernels use now.
func ActiveISA() ISA { return ISA(activeISA.Load()) }

// SetISA selects the kernels' ISA and returns the previous one. It never
// panics: an ISA the CPU lacks (or an unknown value) is clamped down to
// DetectedISA(), so SetISA(ISAAVX512) on an AVX2 machine selects ISAAVX2.
// Check the result with ActiveISA. Tests use it to force each path; it is
// safe to call concurrently with running kernels (each call reads it once).
func SetISA(i ISA) (previous ISA) {
	if i < ISAGeneric {
		i = ISAGeneric
	}
	if d := DetectedISA(); i > d {
		i = d
	}
	return ISA(activeISA.Swap(int32(i)))
}
