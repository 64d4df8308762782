package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestNonFinite checks every ISA path and the pure-Go reference against
// math.IsNaN/IsInf: every length 0..70, misaligned starts, finite data of
// all magnitudes (max float, denormals, ±0), and one NaN or ±Inf placed at
// every position in turn.
func TestNonFinite(t *testing.T) {
	finite := []uint32{0, 0x80000000, 1, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x3f800000}
	bad := []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc12345, 0x7f800001}
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(5, uint64(isa)))
			for n := 0; n <= 70; n++ {
				for _, off := range []int{0, 1} {
					buf := make([]float32, off+n)
					for i := range buf {
						buf[i] = math.Float32frombits(finite[r.IntN(len(finite))])
					}
					x := buf[off:]
					check := func(what string) {
						want := false
						for _, v := range x {
							want = want || math.IsNaN(float64(v)) || math.IsInf(float64(v), 0)
						}
						if got, ref := NonFinite(x), nonFiniteGo(x); got != want || ref != want {
							t.Fatalf("%v n=%d off=%d %s: NonFinite=%v nonFiniteGo=%v, want %v", isa, n, off, what, got, ref, want)
						}
					}
					check("finite")
					for i := range x {
						keep := x[i]
						x[i] = math.Float32frombits(bad[r.IntN(len(bad))])
						check(fmt.Sprintf("x[%d]=%#08x", i, math.Float32bits(x[i])))
						x[i] = keep
					}
				}
			}
		})
	}
}

// BenchmarkNonFinite reports GB/s of one thread's scan, per ISA.
func BenchmarkNonFinite(b *testing.B) {
	x := make([]float32, 1<<18)
	for _, isa := range isasToTest() {
		b.Run(fmt.Sprintf("isa=%v", isa), func(b *testing.B) {
			withISA(b, isa, func() {
				b.SetBytes(int64(4 * len(x)))
				for b.Loop() {
					if NonFinite(x) {
						b.Fatal("zeros reported non-finite")
					}
				}
			})
		})
	}
}
