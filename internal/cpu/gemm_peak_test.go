package cpu

import (
	"testing"
	"time"
)

// TestFMALoops checks that every peak loop this CPU runs does n iterations
// of its accumulators' multiply-adds: the loop returns accumulators·n, so a
// loop that skipped iterations or accumulators would be caught.
func TestFMALoops(t *testing.T) {
	for _, isa := range isasToTest() {
		loop, flops := peakLoopFor(isa)
		accs := flops / 2 / map[ISA]float64{ISAGeneric: 1, ISAAVX2: 8, ISAAVX512: 16}[isa]
		for _, n := range []int{0, 1, 7, 1000} {
			if got, want := loop(n), float32(accs*float64(n)); got != want {
				t.Errorf("%v: loop(%d) = %v, want %v (%v accumulators × n)", isa, n, got, want, accs)
			}
		}
	}
}

// TestFMAPeak checks that FMAPeak returns a plausible rate for every ISA
// and 1 or 2 threads: positive, and below 384 GFLOP/s per thread (64 FLOPs
// per cycle, two 512-bit FMA ports, at 6 GHz), which no x86 core exceeds.
func TestFMAPeak(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, threads := range []int{1, 2} {
				got := FMAPeak(threads, 20*time.Millisecond)
				if !(got > 0.1 && got < 384*float64(threads)) {
					t.Errorf("%v: FMAPeak(%d, 20ms) = %v GFLOP/s, want in (0.1, %d)", isa, threads, got, 384*threads)
				}
			}
		})
	}
}
