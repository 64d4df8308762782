package tensor

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestFusedOpsGradCheck: the fused ops' gradients for every input (y, the
// bias, the residual) against finite differences through the tape (the
// float64 checks of the formulas are internal/cpu's TestFusedGradCheck).
// Dropout draws from a fresh stream on every evaluation, so the mask is
// the same one each time.
func TestFusedOpsGradCheck(t *testing.T) {
	rng := NewRNG(5)
	y, b := randParam(rng, "y", 1, 3, 2, 10), randParam(rng, "b", 0.5, 10)
	r := randParam(rng, "residual", 1, 3, 2, 10)
	gradCheck(t, "bias_gelu_tanh", []*Tensor{y, b}, func(tp *Tape, in []*Tensor) *Tensor { return tp.BiasGELU(in[0], in[1], GELUTanh) })
	gradCheck(t, "bias_gelu_erf", []*Tensor{y, b}, func(tp *Tape, in []*Tensor) *Tensor { return tp.BiasGELU(in[0], in[1], GELUErf) })
	gradCheck(t, "bias_swiglu", []*Tensor{y, b}, func(tp *Tape, in []*Tensor) *Tensor { return tp.BiasSwiGLU(in[0], in[1]) })
	for _, p := range []float32{0, 0.3} {
		gradCheck(t, "bias_dropout_add", []*Tensor{r, y, b}, func(tp *Tape, in []*Tensor) *Tensor {
			return tp.BiasDropoutAdd(in[0], in[1], in[2], p, NewRNG(11))
		})
	}
	gradCheck(t, "dropout_add", []*Tensor{r, y}, func(tp *Tape, in []*Tensor) *Tensor {
		return tp.BiasDropoutAdd(in[0], in[1], nil, 0.5, NewRNG(12))
	})
}

// fusedPair is a fused op and the chain of ops it replaces.
type fusedPair struct {
	name           string
	fused, unfused func(tp *Tape, rng *RNG, r, y, b *Tensor) *Tensor
	swiglu         bool // y's rows are [gate | up]
}

func fusedPairs() []fusedPair {
	pairs := []fusedPair{
		{name: "bias_swiglu", swiglu: true,
			fused:   func(tp *Tape, _ *RNG, _, y, b *Tensor) *Tensor { return tp.BiasSwiGLU(y, b) },
			unfused: func(tp *Tape, _ *RNG, _, y, b *Tensor) *Tensor { return tp.SwiGLU(tp.Add(y, b)) }},
	}
	for _, kind := range []GELUKind{GELUTanh, GELUErf} {
		pairs = append(pairs, fusedPair{name: "bias_gelu",
			fused:   func(tp *Tape, _ *RNG, _, y, b *Tensor) *Tensor { return tp.BiasGELU(y, b, kind) },
			unfused: func(tp *Tape, _ *RNG, _, y, b *Tensor) *Tensor { return tp.GELU(tp.Add(y, b), kind) }})
	}
	for _, p := range []float32{0, 0.1, 1} {
		pairs = append(pairs, fusedPair{name: "bias_dropout_add",
			fused: func(tp *Tape, rng *RNG, r, y, b *Tensor) *Tensor { return tp.BiasDropoutAdd(r, y, b, p, rng) },
			unfused: func(tp *Tape, rng *RNG, r, y, b *Tensor) *Tensor {
				return tp.Add(r, tp.Dropout(tp.Add(y, b), p, rng))
			}},
			fusedPair{name: "dropout_add",
				fused:   func(tp *Tape, rng *RNG, r, y, _ *Tensor) *Tensor { return tp.BiasDropoutAdd(r, y, nil, p, rng) },
				unfused: func(tp *Tape, rng *RNG, r, y, _ *Tensor) *Tensor { return tp.Add(r, tp.Dropout(y, p, rng)) }})
	}
	return pairs
}

// TestFusedOpsMatchUnfused: each fused op gives the output and the
// gradients of every input of the chain it replaces bit for bit, on the
// CPU and the simulated device, and moves the dropout stream as far; the
// rows are wider than the kernels' chunks and not a multiple of the
// vector width. y reaches the op through a Scale, so its gradient is an
// intermediate's (the ownGrad path), and r and y also feed the loss
// directly (gradients that accumulate).
func TestFusedOpsMatchUnfused(t *testing.T) {
	for _, dev := range []Device{CPU, Sim} {
		for _, pair := range fusedPairs() {
			run := func(op func(tp *Tape, rng *RNG, r, y, b *Tensor) *Tensor) (out []float32, grads [][]float32, offset uint64) {
				rng := NewRNG(3)
				c := 1030
				r, y, b := randParam(rng, "r", 1, 5, c), randParam(rng, "y", 2, 5, c), randParam(rng, "b", 1, c)
				ps := []*Tensor{r, y, b}
				MoveParams(dev, ps...)
				tp := NewTape()
				drop := NewRNG(9)
				o := op(tp, drop, r, tp.Scale(y, 1.5), b)
				w := FromFloat32(make([]float32, o.Numel()), o.Shape()...)
				NewRNG(4).Normal(w.Float32s(), 0, 1)
				loss := tp.Add(tp.Sum(tp.Mul(o, w.ToDevice(dev))), tp.Sum(tp.Mul(r, y)))
				if err := tp.Backward(loss); err != nil {
					t.Fatal(err)
				}
				out = ToHost(o).Float32s()
				for _, p := range ps {
					if p.Grad == nil {
						grads = append(grads, nil)
						continue
					}
					grads = append(grads, ToHost(p.Grad).Float32s())
				}
				return out, grads, drop.State().Offset
			}
			fo, fg, foff := run(pair.fused)
			uo, ug, uoff := run(pair.unfused)
			name := dev.String() + " " + pair.name
			sameFloats(t, name+" output", fo, uo)
			for i := range fg {
				sameFloats(t, name+" gradient "+[]string{"r", "y", "b"}[i], fg[i], ug[i])
			}
			if foff != uoff {
				t.Errorf("%s: the dropout stream moved to %d, the unfused chain's to %d", name, foff, uoff)
			}
		}
	}
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, the unfused chain's is %v", what, i, got[i], want[i])
		}
	}
}

// TestBiasDropoutAddKeepsNoMask: the fused op holds its output and the
// mask's bits on the tape where the chain holds the biased sum, the float32
// mask, the dropped values and the output.
func TestBiasDropoutAddKeepsNoMask(t *testing.T) {
	rng := NewRNG(1)
	r, y, b := randParam(rng, "r", 1, 8, 64), randParam(rng, "y", 1, 8, 64), randParam(rng, "b", 1, 64)
	fused, unfused := NewTape(), NewTape()
	fused.BiasDropoutAdd(r, y, b, 0.1, NewRNG(2))
	unfused.Add(r, unfused.Dropout(unfused.Add(y, b), 0.1, NewRNG(2)))
	if got, want := fused.LiveFloats(), 8*64+8*64/32; got != want {
		t.Errorf("fused tape holds %d floats, want %d", got, want)
	}
	if got, want := unfused.LiveFloats(), 4*8*64; got != want {
		t.Errorf("unfused tape holds %d floats, want %d", got, want)
	}
}

// BenchmarkFusedOps times each fused op's forward and backward against
// the chain it replaces at GPT-2 124M's shapes for 1024 tokens (fc1's
// 3072 columns, the residual's 768), alternating the two step by step;
// the add-norm's "unfused" is bias-dropout-add then LayerNorm.
func BenchmarkFusedOps(b *testing.B) {
	const rows = 1024
	for _, c := range []struct {
		name    string
		cols    int
		fused   func(tp *Tape, r, y, bias *Tensor) *Tensor
		unfused func(tp *Tape, r, y, bias *Tensor) *Tensor
	}{
		{"bias_gelu", 3072,
			func(tp *Tape, _, y, bias *Tensor) *Tensor { return tp.BiasGELU(y, bias, GELUTanh) },
			func(tp *Tape, _, y, bias *Tensor) *Tensor { return tp.GELU(tp.Add(y, bias), GELUTanh) }},
		{"bias_dropout_add", 768,
			func(tp *Tape, r, y, bias *Tensor) *Tensor { return tp.BiasDropoutAdd(r, y, bias, 0.1, NewRNG(1)) },
			func(tp *Tape, r, y, bias *Tensor) *Tensor {
				return tp.Add(r, tp.Dropout(tp.Add(y, bias), 0.1, NewRNG(1)))
			}},
		{"bias_dropout_add_layernorm", 768, // both outputs feed the backward: sum + norm
			func(tp *Tape, r, y, bias *Tensor) *Tensor {
				s, o := tp.BiasDropoutAddNorm(r, y, bias, 0.1, NewRNG(1), Norm{Weight: bias, Bias: bias, Eps: 1e-5})
				return tp.Add(s, o)
			},
			func(tp *Tape, r, y, bias *Tensor) *Tensor {
				s := tp.BiasDropoutAdd(r, y, bias, 0.1, NewRNG(1))
				return tp.Add(s, tp.LayerNorm(s, bias, bias, 1e-5))
			}},
	} {
		b.Run(c.name, func(b *testing.B) {
			rng := NewRNG(2)
			r, y, bias := randParam(rng, "r", 1, rows, c.cols), randParam(rng, "y", 1, rows, c.cols), randParam(rng, "b", 1, c.cols)
			g := FromFloat32(make([]float32, rows*c.cols), rows, c.cols)
			var spent [2]time.Duration
			tapes := [2]*Tape{NewTape(), NewTape()}
			run := func(k int) {
				tp, start := tapes[k], time.Now()
				op := c.fused
				if k == 1 {
					op = c.unfused
				}
				out := op(tp, r, tp.Scale(y, 1), bias)
				if err := tp.BackwardFrom([]*Tensor{out}, []*Tensor{g}); err != nil {
					b.Fatal(err)
				}
				tp.Reset()
				spent[k] += time.Since(start)
			}
			run(0)
			run(1)
			spent = [2]time.Duration{}
			for i := range b.N {
				run(i % 2)
				run(1 - i%2)
			}
			b.ReportMetric(float64(spent[0].Microseconds())/float64(b.N), "fused-µs")
			b.ReportMetric(float64(spent[1].Microseconds())/float64(b.N), "unfused-µs")
		})
	}
}

// TestBiasDropoutAddNormGradCheck: BiasDropoutAddNorm's gradients for the
// residual, y, the bias and the norm's weight and bias, through both of its
// outputs, against finite differences (the float64 check of the formula is
// internal/cpu's TestAddNormGradCheck).
func TestBiasDropoutAddNormGradCheck(t *testing.T) {
	rng := NewRNG(6)
	r, y, b := randParam(rng, "residual", 1, 3, 10), randParam(rng, "y", 1, 3, 10), randParam(rng, "b", 0.5, 10)
	w, nb := randParam(rng, "w", 1, 10), randParam(rng, "nb", 1, 10)
	for _, p := range []float32{0, 0.3} {
		gradCheck(t, "bias_dropout_add_layernorm", []*Tensor{r, y, b, w, nb}, func(tp *Tape, in []*Tensor) *Tensor {
			s, o := tp.BiasDropoutAddNorm(in[0], in[1], in[2], p, NewRNG(11), Norm{Weight: in[3], Bias: in[4], Eps: 1e-5})
			return tp.Add(tp.Scale(s, 0.5), o)
		})
		gradCheck(t, "bias_dropout_add_rmsnorm", []*Tensor{r, y, b, w}, func(tp *Tape, in []*Tensor) *Tensor {
			s, o := tp.BiasDropoutAddNorm(in[0], in[1], in[2], p, NewRNG(11), Norm{RMS: true, Weight: in[3], Eps: 1e-6})
			return tp.Add(tp.Scale(s, 0.5), o)
		})
	}
}

// TestBiasDropoutAddNormMatchesUnfused: BiasDropoutAddNorm gives sum, the
// norm's output and the gradients of every input of BiasDropoutAdd then
// LayerNorm (or RMSNorm) bit for bit, on the CPU and the simulated device,
// moves the dropout stream as far and keeps as many floats on the tape:
// LayerNorm with and without its bias, RMSNorm, a 1 + γ weight computed on
// the tape, with and without the bias and dropout (p 0, 0.1, 1): 37 rows
// of 1030 (groups of 16 rows and a last of 5), 9 of 768 (one short group)
// and 70 of 5 (odd: groups of 32 rows, Philox blocks and mask words
// straddling rows). Both outputs feed the loss, and sum also a later op, as a layer's
// residual stream does.
func TestBiasDropoutAddNormMatchesUnfused(t *testing.T) {
	type variant struct {
		name       string
		rms, nb    bool
		onePlus    bool
		bias       bool
		p          float32
		rows, cols int
	}
	var vs []variant
	for _, p := range []float32{0, 0.1, 1} {
		vs = append(vs, variant{"layernorm", false, true, false, true, p, 37, 1030},
			variant{"layernorm-no-bias", false, false, false, false, p, 9, 768},
			variant{"rmsnorm", true, false, false, true, p, 70, 5},
			variant{"layernorm-1p", false, true, true, true, p, 33, 5})
	}
	for _, dev := range []Device{CPU, Sim} {
		for _, v := range vs {
			run := func(fused bool) (outs, grads [][]float32, offset uint64, live int) {
				rng := NewRNG(3)
				r, y := randParam(rng, "r", 1, v.rows, v.cols), randParam(rng, "y", 2, v.rows, v.cols)
				b, w, nb := randParam(rng, "b", 1, v.cols), randParam(rng, "w", 1, v.cols), randParam(rng, "nb", 1, v.cols)
				ps := []*Tensor{r, y, b, w, nb}
				MoveParams(dev, ps...)
				tp := NewTape()
				drop := NewRNG(9)
				bias := b
				if !v.bias {
					bias = nil
				}
				n := Norm{RMS: v.rms, Weight: w, Eps: 1e-5}
				if v.onePlus {
					one := FromFloat32(make([]float32, v.cols), v.cols)
					for i := range one.Float32s() {
						one.Float32s()[i] = 1
					}
					n.Weight = tp.Add(w, one.ToDevice(dev))
				}
				if v.nb {
					n.Bias = nb
				}
				yy := tp.Scale(y, 1.5)
				var s, o *Tensor
				if fused {
					s, o = tp.BiasDropoutAddNorm(r, yy, bias, v.p, drop, n)
				} else {
					s = tp.BiasDropoutAdd(r, yy, bias, v.p, drop)
					if v.rms {
						o = tp.RMSNorm(s, n.Weight, n.Eps)
					} else {
						o = tp.LayerNorm(s, n.Weight, n.Bias, n.Eps)
					}
				}
				live = tp.LiveFloats()
				g := FromFloat32(make([]float32, o.Numel()), o.Shape()...)
				NewRNG(4).Normal(g.Float32s(), 0, 1)
				later := tp.Mul(tp.Add(s, yy), g.ToDevice(dev)) // the residual stream's later use
				loss := tp.Add(tp.Add(tp.Sum(tp.Mul(o, g.ToDevice(dev))), tp.Sum(later)), tp.Sum(tp.Mul(r, y)))
				if err := tp.Backward(loss); err != nil {
					t.Fatal(err)
				}
				outs = [][]float32{ToHost(s).Float32s(), ToHost(o).Float32s()}
				for _, p := range ps {
					if p.Grad == nil {
						grads = append(grads, nil)
						continue
					}
					grads = append(grads, ToHost(p.Grad).Float32s())
				}
				return outs, grads, drop.State().Offset, live
			}
			fo, fg, foff, flive := run(true)
			uo, ug, uoff, ulive := run(false)
			name := fmt.Sprintf("%v %s p=%v bias=%v %dx%d", dev, v.name, v.p, v.bias, v.rows, v.cols)
			sameFloats(t, name+" sum", fo[0], uo[0])
			sameFloats(t, name+" norm", fo[1], uo[1])
			for i := range fg {
				if (fg[i] == nil) != (ug[i] == nil) {
					t.Fatalf("%s: gradient %d present %v, the chain's %v", name, i, fg[i] != nil, ug[i] != nil)
				}
				sameFloats(t, name+" gradient "+[]string{"r", "y", "b", "w", "nb"}[i], fg[i], ug[i])
			}
			if foff != uoff {
				t.Errorf("%s: the dropout stream moved to %d, the chain's to %d", name, foff, uoff)
			}
			if flive != ulive {
				t.Errorf("%s: the fused tape holds %d floats, the chain's %d", name, flive, ulive)
			}
		}
	}
}
