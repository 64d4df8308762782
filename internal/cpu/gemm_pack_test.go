package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestPackBPanelStrips holds the assembly strip packer of row-major B (the
// kernel set's strips) to the definition of a packed panel and to the Go
// copy loop it replaces: odd and tiny kc, partial last strips, leading
// dimensions above n, offsets into B, and a B slice that ends at the
// block's last element. Packed floats past the panel must stay untouched.
func TestPackBPanelStrips(t *testing.T) {
	var sets []kernSet
	for _, isa := range isasToTest() {
		if ks := kernelsFor(isa); ks.strips != nil {
			sets = append(sets, ks)
		}
	}
	if len(sets) == 0 {
		t.Skip("no ISA with a strip packer on this CPU")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, ks := range sets {
		nr := ks.nr
		goKS := ks
		goKS.strips = nil
		for _, kc := range []int{1, 2, 3, 4, 5, 17, 512, 513} {
			for _, nc := range []int{1, nr - 1, nr, nr + 1, 2*nr + 5, 3 * nr, 5*nr - 1} {
				for _, pad := range []int{0, 3, 64} {
					p0, j0 := 5, 7
					ldb := j0 + nc + pad
					// b ends at the block's last element.
					b := make([]float32, (p0+kc-1)*ldb+j0+nc)
					for i := range b {
						b[i] = rng.Float32()*2 - 1
					}
					strips := (nc + nr - 1) / nr
					size := strips * kc * nr
					got := make([]float32, size+nr)
					want := make([]float32, size+nr)
					for i := range got {
						got[i] = float32(math.NaN())
						want[i] = float32(math.NaN())
					}
					name := fmt.Sprintf("nr=%d/kc=%d/nc=%d/ldb=%d", nr, kc, nc, ldb)
					packBPanel(&ks, got, NoTrans, b, ldb, p0, j0, kc, nc)
					packBPanel(&goKS, want, NoTrans, b, ldb, p0, j0, kc, nc)
					for s := 0; s < strips; s++ {
						for p := 0; p < kc; p++ {
							for j := 0; j < nr; j++ {
								var def float32
								if s*nr+j < nc {
									def = b[(p0+p)*ldb+j0+s*nr+j]
								}
								i := s*kc*nr + p*nr + j
								if got[i] != def || want[i] != def {
									t.Fatalf("%s: strip %d row %d col %d: asm %v, Go %v, want %v", name, s, p, j, got[i], want[i], def)
								}
							}
						}
					}
					for i := size; i < len(got); i++ {
						if !math.IsNaN(float64(got[i])) {
							t.Fatalf("%s: wrote past the panel at %d", name, i)
						}
					}
				}
			}
		}
	}
}
