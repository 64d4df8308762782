package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// elemInputs returns n values: mostly normal(0, 3), with the special values
// the kernels must treat exactly like the Go loops (±0, denormals, huge
// values whose cube overflows, ±Inf, NaN) scattered in.
func elemInputs(r *rand.Rand, n int) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, 9, -9, 44, -44, 90, -90, 1e20, -1e20,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, -math.MaxFloat32}
	x := make([]float32, n)
	for i := range x {
		if r.IntN(8) == 0 {
			x[i] = special[r.IntN(len(special))]
		} else {
			x[i] = float32(3 * r.NormFloat64())
		}
	}
	return x
}

// dotInputs returns n standard normal values, or with special elemInputs':
// tests of summation order need the former (one Inf, NaN or huge value
// swamps every other term and hides the order).
func dotInputs(r *rand.Rand, n int, special bool) []float32 {
	if special {
		return elemInputs(r, n)
	}
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// sameBits reports whether a and b are equal bit for bit, or both NaN
// (x86 may pick either operand's NaN payload).
func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// TestGELUTanhKernelBits holds the fused AVX-512 GELU kernels to the Go
// loops bit for bit (the Go loops run on other ISAs and on tails, so every
// machine computes the same activations), on inputs with special values.
func TestGELUTanhKernelBits(t *testing.T) {
	if DetectedISA() < ISAAVX512 {
		t.Skip("no AVX-512 on this CPU: the fused kernel is not used")
	}
	withISA(t, ISAAVX512, func() {
		r := rand.New(rand.NewPCG(1, 2))
		for _, n := range []int{16, 32, 48, 256, 272, 1024 + 16} {
			x, g, d0 := elemInputs(r, n), elemInputs(r, n), elemInputs(r, n)
			got, want := make([]float32, n), make([]float32, n)
			if k := geluTanhForwardVec(got, x); k != n {
				t.Fatalf("n=%d: vector prefix %d", n, k)
			}
			geluTanhForwardGo(want, x)
			dgot, dwant := append([]float32(nil), d0...), append([]float32(nil), d0...)
			geluTanhBackwardVec(dgot, g, x)
			geluTanhBackwardGo(dwant, g, x)
			for i := range n {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("forward n=%d x[%d]=%g: kernel %g (%#08x), Go %g (%#08x)", n, i, x[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
				if !sameBits(dgot[i], dwant[i]) {
					t.Fatalf("backward n=%d x[%d]=%g g=%g: kernel %g, Go %g", n, i, x[i], g[i], dgot[i], dwant[i])
				}
			}
		}
	})
}

// TestGELUTanhAVX2Bits holds the fused AVX2 GELU forward kernel to the Go
// loop on AVX2 (whose exp is the AVX2 exp kernel) bit for bit, on inputs
// with special values, lengths with and without a tail.
func TestGELUTanhAVX2Bits(t *testing.T) {
	if DetectedISA() < ISAAVX2 {
		t.Skip("no AVX2 on this CPU: the fused kernel is not used")
	}
	withISA(t, ISAAVX2, func() {
		r := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{7, 8, 16, 24, 255, 256, 257, 1024 + 8} {
			x := elemInputs(r, n)
			got, want := make([]float32, n), make([]float32, n)
			k := geluTanhForwardVec(got, x)
			if k != n&^7 {
				t.Fatalf("n=%d: vector prefix %d", n, k)
			}
			geluTanhForwardGo(got[k:], x[k:])
			geluTanhForwardGo(want, x)
			for i := range n {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d x[%d]=%g: kernel %g (%#08x), Go %g (%#08x)", n, i, x[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
			}
		}
	})
}

// TestSiLUKernelBits holds the fused AVX-512 SiLU and SwiGLU kernels to
// the Go loops bit for bit.
func TestSiLUKernelBits(t *testing.T) {
	if DetectedISA() < ISAAVX512 {
		t.Skip("no AVX-512 on this CPU: the fused kernel is not used")
	}
	withISA(t, ISAAVX512, func() {
		r := rand.New(rand.NewPCG(6, 7))
		for _, n := range []int{16, 48, 272, 1040} {
			x, up, g, d0 := elemInputs(r, n), elemInputs(r, n), elemInputs(r, n), elemInputs(r, n)
			check := func(what string, got, want []float32) {
				t.Helper()
				for i := range want {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("%s n=%d x[%d]=%g up=%g g=%g: kernel %g, Go %g", what, n, i, x[i], up[i], g[i], got[i], want[i])
					}
				}
			}
			got, want := make([]float32, n), make([]float32, n)
			siluForwardVec(got, x)
			siluForwardGo(want, x)
			check("silu forward", got, want)
			got, want = append([]float32(nil), d0...), append([]float32(nil), d0...)
			siluBackwardVec(got, g, x)
			siluBackwardGo(want, g, x)
			check("silu backward", got, want)
			got, want = make([]float32, n), make([]float32, n)
			swigluForwardVec(got, x, up)
			swigluForwardGo(want, x, up)
			check("swiglu forward", got, want)
			gotG, wantG := append([]float32(nil), d0...), append([]float32(nil), d0...)
			gotU, wantU := append([]float32(nil), up...), append([]float32(nil), up...)
			if k := swigluBackwardVec(gotG, gotU, g, x, up); k != n {
				t.Fatalf("n=%d: vector prefix %d", n, k)
			}
			swigluBackwardGo(wantG, wantU, g, x, up)
			check("swiglu dgate", gotG, wantG)
			check("swiglu dup", gotU, wantU)
		}
	})
}

// TestCrossEntropyGradKernel holds the fused cross-entropy gradient row to
// the unfused Go sequence (copy, exp, scale) bit for bit.
func TestCrossEntropyGradKernel(t *testing.T) {
	if DetectedISA() < ISAAVX512 {
		t.Skip("no AVX-512 on this CPU: the fused kernel is not used")
	}
	withISA(t, ISAAVX512, func() {
		r := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{16, 64, 50256} {
			x := elemInputs(r, n)
			x[r.IntN(n)] = float32(math.Inf(-1)) // masked logit: exactly 0
			lse, g, u := float32(7.25), float32(0.37), float32(0.1)/float32(n)
			got, want := make([]float32, n), append([]float32(nil), x...)
			if k := ceGradVec(got, x, lse, g, u); k != n {
				t.Fatalf("n=%d: vector prefix %d", n, k)
			}
			expSubF32(want, lse)
			for j := range want {
				want[j] = g * (want[j] - u)
			}
			for i := range n {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d x[%d]=%g: kernel %g, Go %g", n, i, x[i], got[i], want[i])
				}
			}
		}
	})
}

// TestAxpy checks every ISA against the plain loop, bit for bit: lengths
// 0..70 (every tail), unaligned starts, a = 1 and others.
func TestAxpy(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(5, uint64(isa)))
			for n := 0; n <= 70; n++ {
				for _, a := range []float32{1, -0.5, 3.3} {
					for _, off := range []int{0, 1, 3} {
						x := elemInputs(r, n+off)[off:]
						y0 := elemInputs(r, n+off+2)[off:]
						got, want := append([]float32(nil), y0...), append([]float32(nil), y0...)
						Axpy(got, x, a)
						for i, v := range x {
							want[i] += a * v
						}
						for i := range want {
							if !sameBits(got[i], want[i]) {
								t.Fatalf("%v n=%d a=%g off=%d: y[%d] = %g, want %g", isa, n, a, off, i, got[i], want[i])
							}
						}
					}
				}
			}
		})
	}
}

// TestAddAndLNParamGrad checks Add and the LayerNorm weight-gradient row
// kernel on every ISA against their plain loops, bit for bit: lengths
// 0..70, unaligned starts, and Add in place over either operand.
func TestAddAndLNParamGrad(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(11, uint64(isa)))
			for n := 0; n <= 70; n++ {
				for _, off := range []int{0, 1, 5} {
					a, b := elemInputs(r, n+off)[off:], elemInputs(r, n+off)[off:]
					want := make([]float32, n)
					for i := range want {
						want[i] = a[i] + b[i]
					}
					got := make([]float32, n)
					Add(got, a, b)
					inA := append([]float32(nil), a...)
					Add(inA, inA, b)
					inB := append([]float32(nil), b...)
					Add(inB, a, inB)
					for i := range want {
						if !sameBits(got[i], want[i]) || !sameBits(inA[i], want[i]) || !sameBits(inB[i], want[i]) {
							t.Fatalf("%v Add n=%d off=%d [%d]: %g, in place %g/%g, want %g", isa, n, off, i, got[i], inA[i], inB[i], want[i])
						}
					}
					dw0 := elemInputs(r, n)
					m, rs := float32(0.3), float32(1.7)
					gotW, wantW := append([]float32(nil), dw0...), append([]float32(nil), dw0...)
					k := lnParamGradVec(gotW, b, a, m, rs)
					for j := k; j < n; j++ {
						gotW[j] += b[j] * (a[j] - m) * rs
					}
					for j := range wantW {
						wantW[j] += b[j] * (a[j] - m) * rs
					}
					for j := range wantW {
						if !sameBits(gotW[j], wantW[j]) {
							t.Fatalf("%v lnParamGrad n=%d off=%d [%d]: %g, want %g", isa, n, off, j, gotW[j], wantW[j])
						}
					}
				}
			}
		})
	}
}

// BenchmarkElementwise reports GB/s (bytes read and written) of the fused
// kernels against the Go loops, on one goroutine.
func BenchmarkElementwise(b *testing.B) {
	const n = 1 << 16
	r := rand.New(rand.NewPCG(1, 1))
	// Plain normal values: denormals take microcode assists and would time those.
	x, g, out := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], g[i] = float32(3*r.NormFloat64()), float32(r.NormFloat64())
	}
	for _, isa := range isasToTest() {
		withISA(b, isa, func() {
			b.Run(fmt.Sprintf("gelu_fwd/isa=%v", isa), func(b *testing.B) {
				b.SetBytes(8 * n)
				for b.Loop() {
					k := geluTanhForwardVec(out, x)
					geluTanhForwardGo(out[k:], x[k:])
				}
			})
			b.Run(fmt.Sprintf("gelu_bwd/isa=%v", isa), func(b *testing.B) {
				b.SetBytes(16 * n)
				for b.Loop() {
					k := geluTanhBackwardVec(out, g, x)
					geluTanhBackwardGo(out[k:], g[k:], x[k:])
				}
			})
			b.Run(fmt.Sprintf("axpy/isa=%v", isa), func(b *testing.B) {
				b.SetBytes(12 * n)
				for b.Loop() {
					Axpy(out, x, 0.5)
				}
			})
		})
	}
}

// TestGELUErfKernelAccuracy holds the AVX-512 erf-GELU to float64 x·Φ(x)
// (Φ from math.Erfc, accurate in both tails) on a dense grid over
// [-14, 14]: relative error within 2.5e-6 of the output for |x| <= 8 and
// 1e-5 beyond (the float32 argument of exp(-x²/2) carries ~x²·3e-8),
// down to |out| = 1e-30 (below, exp's range ends and results flush to
// zero), where torch's float32 0.5x(1+erf(x/√2)) has long cancelled to 0;
// for the derivative, 4e-6 relative or 2e-7 absolute
// (it crosses zero near x = -0.75).
func TestGELUErfKernelAccuracy(t *testing.T) {
	if DetectedISA() < ISAAVX512 {
		t.Skip("no AVX-512 on this CPU: the float64 loop is used")
	}
	const n = 28000
	x, g := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = -14 + 28*float32(i)/n
		g[i] = 1
	}
	out, dx := make([]float32, n), make([]float32, n)
	withISA(t, ISAAVX512, func() {
		if geluErfForwardVec(out, x) != n || geluErfBackwardVec(dx, g, x) != n {
			t.Fatal("vector kernels did not take the whole grid")
		}
	})
	var worst, worstD float64
	for i, v := range x {
		xv := float64(v)
		phi := 0.5 * math.Erfc(-xv/math.Sqrt2)
		want := xv * phi
		wantD := phi + xv*math.Exp(-0.5*xv*xv)/math.Sqrt(2*math.Pi)
		if math.Abs(want) >= 1e-30 {
			rel := math.Abs(float64(out[i])-want) / math.Abs(want)
			worst = max(worst, rel)
			if tol := 2.5e-6; rel > tol && (math.Abs(xv) <= 8 || rel > 4*tol) {
				t.Fatalf("gelu(%g) = %g, want %g (relative error %.2g)", v, out[i], want, rel)
			}
		} else if math.Abs(float64(out[i])-want) > 1e-30 {
			t.Fatalf("gelu(%g) = %g, want %g (tiny)", v, out[i], want)
		}
		errD := math.Abs(float64(dx[i]) - wantD)
		worstD = max(worstD, errD/max(math.Abs(wantD), 0.05))
		if errD > 4e-6*math.Abs(wantD) && errD > 2e-7 {
			t.Fatalf("gelu'(%g) = %g, want %g", v, dx[i], wantD)
		}
	}
	t.Logf("max relative error: forward %.3g, backward %.3g", worst, worstD)
}

// TestActivationsThreadIndependent checks that every activation gives the
// same bits with 1, 2, 3 and 7 threads on a length that is not a multiple
// of 16 or of any chunk size (the vector and scalar paths differ in the
// last bits, so the split between them must not move with the threads).
func TestActivationsThreadIndependent(t *testing.T) {
	defer SetThreads(SetThreads(1))
	n := 5*actGrain + 37
	r := rand.New(rand.NewPCG(9, 9))
	x, g := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], g[i] = float32(4*r.NormFloat64()), float32(r.NormFloat64())
	}
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, a := range []struct {
				name string
				fwd  func(out, inp []float32)
				bwd  func(dinp, dout, inp []float32)
			}{
				{"gelu-tanh", GELUTanhForward, GELUTanhBackward},
				{"gelu-erf", GELUErfForward, GELUErfBackward},
				{"silu", SiLUForward, SiLUBackward},
			} {
				var want, wantD []float32
				for _, threads := range []int{1, 2, 3, 7} {
					SetThreads(threads)
					out, dx := make([]float32, n), make([]float32, n)
					a.fwd(out, x)
					a.bwd(dx, g, x)
					if want == nil {
						want, wantD = out, dx
						continue
					}
					for i := range out {
						if !sameBits(out[i], want[i]) || !sameBits(dx[i], wantD[i]) {
							t.Fatalf("%v %s: element %d differs with %d threads: %g/%g vs %g/%g (1 thread)", isa, a.name, i, threads, out[i], dx[i], want[i], wantD[i])
						}
					}
				}
			}
		})
	}
}

// TestDotF64 holds DotF64 on every ISA to its definition (16 fused float64
// partial sums added in order), bit for bit, and to an exact-enough float64
// reference: lengths 0..100, unaligned starts. Inputs are normal values
// (so a change in the order of the sums shows in the last bits), and for
// one start elemInputs' special values.
func TestDotF64(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(9, uint64(isa)))
			for n := 0; n <= 100; n++ {
				for _, off := range []int{0, 1, 3} {
					a := dotInputs(r, n+off, off == 3)[off:]
					b := dotInputs(r, n+off+1, off == 3)[off:]
					var acc [16]float64
					var naive, abs float64
					for i := range a {
						acc[i%16] = math.FMA(float64(a[i]), float64(b[i]), acc[i%16])
						naive += float64(a[i]) * float64(b[i])
						abs += math.Abs(float64(a[i]) * float64(b[i]))
					}
					var want float64
					for _, v := range acc {
						want += v
					}
					got := DotF64(a, b)
					if math.Float64bits(got) != math.Float64bits(want) {
						t.Fatalf("%v n=%d off=%d: DotF64 = %v, its definition gives %v", isa, n, off, got, want)
					}
					if math.Abs(got-naive) > 1e-13*abs {
						t.Fatalf("%v n=%d: DotF64 = %v, naive float64 sum %v", isa, n, got, naive)
					}
				}
			}
		})
	}
}

// TestDotsF64AndAxpys holds the batched attention kernels to the calls they
// replace, bit for bit, on every ISA: DotsF64 to DotF64·scale per key, and
// Axpys to Axpy per row in order; head dims 1..272 (vector kernels and the
// fallback), 0..35 rows (the AVX-512 kernel's groups of eight and the rest),
// strides longer than a row and unaligned starts. Most inputs are normal
// values, so that any change in the order of the sums shows in the last
// bits; every fourth case draws elemInputs' special values too.
func TestDotsF64AndAxpys(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(13, uint64(isa)))
			for _, d := range []int{1, 8, 15, 16, 17, 32, 48, 64, 80, 96, 128, 144, 256, 272} {
				for ni, n := range []int{0, 1, 2, 7, 8, 16, 19, 35} {
					special := (ni+d)%4 == 0
					ld := d + r.IntN(3)*16 + r.IntN(2)
					off := r.IntN(3)
					k := dotInputs(r, off+n*ld+d, special)[off:]
					q := dotInputs(r, d+off, special)[off:]
					if n > 0 && special {
						k[0], q[0] = float32(math.Copysign(0, -1)), 1e30
					}
					scale := 1 / math.Sqrt(float64(d))
					got := make([]float64, n)
					DotsF64(got, q, k, ld, scale)
					for j := range n {
						want := DotF64(q, k[j*ld:][:d]) * scale
						if math.Float64bits(got[j]) != math.Float64bits(want) {
							t.Fatalf("%v d=%d n=%d ld=%d: DotsF64[%d] = %v, DotF64·scale = %v", isa, d, n, ld, j, got[j], want)
						}
					}
					w := dotInputs(r, n, special)
					if n > 1 {
						w[1] = 1e-30
					}
					y0 := dotInputs(r, d+off, special)[off:]
					gotY, wantY := append([]float32(nil), y0...), append([]float32(nil), y0...)
					Axpys(gotY, k, ld, w)
					for j, a := range w {
						Axpy(wantY, k[j*ld:][:d], a)
					}
					for i := range wantY {
						if !sameBits(gotY[i], wantY[i]) {
							t.Fatalf("%v d=%d n=%d ld=%d: Axpys y[%d] = %g, Axpy per row %g", isa, d, n, ld, i, gotY[i], wantY[i])
						}
					}
				}
			}
			for name, f := range map[string]func(){
				"DotsF64 short k": func() { DotsF64(make([]float64, 3), make([]float32, 16), make([]float32, 40), 16, 1) },
				"Axpys short x":   func() { Axpys(make([]float32, 16), make([]float32, 40), 16, make([]float32, 3)) },
			} {
				func() {
					defer func() {
						if recover() == nil {
							t.Errorf("%s: no panic", name)
						}
					}()
					f()
				}()
			}
		})
	}
}

// TestSoftmaxWeights holds SoftmaxWeights to the formula with math.Max
// (what decoding computed before), bit for bit: random scores, signed
// zeros, a spread past exp's range, a lone score, and a NaN (every weight
// NaN); the weights of finite scores sum to 1.
func TestSoftmaxWeights(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 1))
	ref := func(sc []float64) []float32 {
		mx := math.Inf(-1)
		for _, v := range sc {
			mx = math.Max(mx, v)
		}
		e, sum := make([]float64, len(sc)), 0.0
		for j, v := range sc {
			e[j] = math.Exp(v - mx)
			sum += e[j]
		}
		w := make([]float32, len(sc))
		for j, v := range e {
			w[j] = float32(v / sum)
		}
		return w
	}
	cases := [][]float64{{0.5}, {math.Copysign(0, -1), 0, math.Copysign(0, -1)}, {-800, 0, 3}, {1, math.NaN(), 2}}
	for range 50 {
		sc := make([]float64, 1+r.IntN(300))
		for j := range sc {
			sc[j] = 8 * r.NormFloat64()
		}
		cases = append(cases, sc)
	}
	for _, sc := range cases {
		want := ref(sc)
		got := make([]float32, len(sc))
		SoftmaxWeights(got, append([]float64(nil), sc...))
		var sum float64
		for j := range got {
			if !sameBits(got[j], want[j]) {
				t.Fatalf("scores %v: weight %d = %v, want %v", sc, j, got[j], want[j])
			}
			sum += float64(got[j])
		}
		if finite := !slices.ContainsFunc(sc, math.IsNaN); finite && math.Abs(sum-1) > 1e-5 {
			t.Fatalf("weights sum to %v", sum)
		} else if !finite && !math.IsNaN(float64(got[0])) {
			t.Fatalf("a NaN score gave weight %v", got[0])
		}
	}
}
