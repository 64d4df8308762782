package cpu

import (
	"math/rand/v2"
	"testing"
)

// biasRef returns y + b (b repeating along y's rows), in float64.
func biasRef(y, b []float64) []float64 {
	t := make([]float64, len(y))
	for i, v := range y {
		t[i] = v + b[i%len(b)]
	}
	return t
}

// sumRowsRef adds the rows of d (n, c) into db (c).
func sumRowsRef(db, d []float64) {
	for i, v := range d {
		db[i%len(db)] += v
	}
}

// TestFusedGradCheck checks the float64 references of the fused ops —
// the activation of y + b, with the bias's gradient the row sum of y's —
// against central finite differences, for y and b.
func TestFusedGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, a := range []struct {
		name string
		fwd  func(out, inp []float64)
		bwd  func(dinp, dout, inp []float64)
	}{
		{"bias-gelu-tanh", geluTanhForwardRef, geluTanhBackwardRef},
		{"bias-gelu-erf", geluErfForwardRef, geluErfBackwardRef},
	} {
		t.Run(a.name, func(t *testing.T) {
			y, b := randF64(rng, 4*9, 3), randF64(rng, 9, 1)
			out := make([]float64, len(y))
			gradCheck(t, []gcInput{{"y", y}, {"b", b}},
				func() []float64 { a.fwd(out, biasRef(y, b)); return out },
				func(g []float64, gr [][]float64) {
					dy := make([]float64, len(y))
					a.bwd(dy, g, biasRef(y, b))
					sumRowsRef(gr[1], dy)
					for i, v := range dy {
						gr[0][i] += v
					}
				}, false)
		})
	}
	t.Run("bias-swiglu", func(t *testing.T) {
		n, f := 3, 5
		y, b := randF64(rng, n*2*f, 3), randF64(rng, 2*f, 1)
		out := make([]float64, n*f)
		gradCheck(t, []gcInput{{"y", y}, {"b", b}},
			func() []float64 { swigluForwardRef(out, biasRef(y, b), n, f); return out },
			func(g []float64, gr [][]float64) {
				dy := make([]float64, len(y))
				swigluBackwardRef(dy, g, biasRef(y, b), n, f)
				sumRowsRef(gr[1], dy)
				for i, v := range dy {
					gr[0][i] += v
				}
			}, false)
	})
}

// TestFusedMatchesUnfused: each fused kernel gives Add then the
// activation bit for bit (rows wider than a chunk, and not multiples of
// the vector width, so every split between the vector and Go paths runs),
// and the float64 references within the activations' tolerance.
func TestFusedMatchesUnfused(t *testing.T) {
	for _, isa := range []ISA{ISAGeneric, ISAAVX2, ISAAVX512} {
		if isa > DetectedISA() {
			continue
		}
		t.Run(isa.String(), func(t *testing.T) { withISA(t, isa, func() { fusedMatchesUnfused(t) }) })
	}
}

func fusedMatchesUnfused(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	addRows := func(y, b []float32) []float32 {
		t := make([]float32, len(y))
		for r := 0; r < len(y)/len(b); r++ {
			Add(t[r*len(b):], y[r*len(b):(r+1)*len(b)], b)
		}
		return t
	}
	for _, sh := range []struct{ n, c int }{{1, 1}, {3, 17}, {7, 300}, {40, 1030}} {
		y, b := to32(randF64(rng, sh.n*sh.c, 4)), to32(randF64(rng, sh.c, 1))
		g := to32(randF64(rng, sh.n*sh.c, 1))
		for _, tanh := range []bool{true, false} {
			fwd, bwd := GELUErfForward, GELUErfBackward
			if tanh {
				fwd, bwd = GELUTanhForward, GELUTanhBackward
			}
			want, got := make([]float32, len(y)), make([]float32, len(y))
			fwd(want, addRows(y, b))
			BiasGELUForward(got, y, b, tanh)
			sameSlices(t, "bias-gelu out", got, want)
			wantD, gotD := to32(filled(len(y), 0.5)), to32(filled(len(y), 0.5))
			bwd(wantD, g, addRows(y, b))
			BiasGELUBackward(gotD, g, y, b, tanh)
			sameSlices(t, "bias-gelu dy", gotD, wantD)
		}
		if sh.c%2 == 0 {
			n, f := sh.n, sh.c/2
			gh := g[:n*f]
			want, got := make([]float32, n*f), make([]float32, n*f)
			SwiGLUForward(want, addRows(y, b), n, f)
			BiasSwiGLUForward(got, y, b, n, f)
			sameSlices(t, "bias-swiglu out", got, want)
			wantD, gotD := to32(filled(len(y), 0.5)), to32(filled(len(y), 0.5))
			SwiGLUBackward(wantD, gh, addRows(y, b), n, f)
			BiasSwiGLUBackward(gotD, gh, y, b, n, f)
			sameSlices(t, "bias-swiglu dy", gotD, wantD)
			ref := make([]float64, n*f)
			swigluForwardRef(ref, biasRef(to64(y), to64(b)), n, f)
			assertClose(t, "bias-swiglu out vs reference", got, ref, fastTol)
		}
	}
}

func sameSlices(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if !sameBits(got[i], want[i]) {
			t.Fatalf("%s[%d] = %v, the unfused chain gives %v", what, i, got[i], want[i])
		}
	}
}

// TestAddNormGradCheck checks in float64 the backward of the fused residual
// add + norm (tensor's BiasDropoutAddNorm): sum = r + (y + b)·mask and
// out = norm(sum), both outputs, the norm's gradient added into sum's
// before the bias-dropout-add's backward passes it on (r's gradient is
// sum's, y's sum's times the mask, b's the row sum of y's), against
// central finite differences for r, y, b and the norm's weight and bias,
// LayerNorm and RMSNorm.
func TestAddNormGradCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	n, c := 3, 7
	mask := make([]float64, n*c)
	for i := range mask {
		if rng.Float64() > 0.3 {
			mask[i] = 1 / 0.7
		}
	}
	for _, rms := range []bool{false, true} {
		name := "layernorm"
		if rms {
			name = "rmsnorm"
		}
		t.Run(name, func(t *testing.T) {
			r, y, b := randF64(rng, n*c, 1), randF64(rng, n*c, 1), randF64(rng, c, 1)
			w, nb := randF64(rng, c, 1), randF64(rng, c, 1)
			mean, rstd := make([]float64, n), make([]float64, n)
			sum := func() []float64 {
				s := biasRef(y, b)
				for i := range s {
					s[i] = r[i] + s[i]*mask[i]
				}
				return s
			}
			fwd := func() []float64 {
				s := sum()
				out := make([]float64, 2*n*c)
				copy(out, s)
				if rms {
					rmsNormForwardRef(out[n*c:], rstd, s, w, n, c, 1e-5)
				} else {
					layerNormForwardRef(out[n*c:], mean, rstd, s, w, nb, n, c, 1e-5)
				}
				return out
			}
			ins := []gcInput{{"r", r}, {"y", y}, {"b", b}, {"w", w}}
			if !rms {
				ins = append(ins, gcInput{"nb", nb})
			}
			gradCheck(t, ins, fwd, func(g []float64, gr [][]float64) {
				fwd() // mean and rstd at the current inputs
				s := sum()
				ds := append([]float64(nil), g[:n*c]...)
				if rms {
					rmsNormBackwardRef(ds, gr[3], g[n*c:], s, w, rstd, n, c)
				} else {
					layerNormBackwardRef(ds, gr[3], gr[4], g[n*c:], s, w, mean, rstd, n, c)
				}
				dy := make([]float64, n*c)
				for i, v := range ds {
					gr[0][i] += v
					dy[i] = v * mask[i]
					gr[1][i] += dy[i]
				}
				sumRowsRef(gr[2], dy)
			}, false)
		})
	}
}
