package tensor

import (
	"math"
	"strings"
	"testing"
)

// TestGDNRunsMatchWhole: two sequences decoded in pieces — runs of 2, 1, 3
// and 1 tokens with the other sequence's tokens between them in each call,
// the state carried from call to call — get from CausalConvSiLURuns and
// GatedDeltaRuleRuns the bits CausalConvSiLU and GatedDeltaRule give each
// sequence whole (a kernel of 4, so a run is shorter than its window; the
// delta rule's recurrent form, whose arithmetic decoding repeats).
func TestGDNRunsMatchWhole(t *testing.T) {
	rng := NewRNG(9)
	const T, c, k, kh, heads, dk, dv = 7, 6, 4, 1, 2, 3, 4
	scale := 1 / math.Sqrt(dk)
	x := [2]*Tensor{randParam(rng, "x0", 1, 1, T, c), randParam(rng, "x1", 1, 1, T, c)}
	w := randParam(rng, "w", 0.5, c, k)
	type seqIn struct{ q, k, v, g, beta *Tensor }
	var in [2]seqIn
	for s := range in {
		in[s] = seqIn{randParam(rng, "q", 1, 1, T, kh, dk), randParam(rng, "k", 1, 1, T, kh, dk), randParam(rng, "v", 1, 1, T, heads, dv),
			randParam(rng, "g", 0.3, 1, T, heads), randParam(rng, "beta", 0.2, 1, T, heads)}
		for i := range in[s].g.Float32s() {
			in[s].g.Float32s()[i] -= 0.4
			in[s].beta.Float32s()[i] += 0.5
		}
	}
	var tp *Tape
	var wholeConv, wholeRule [2][]float32
	for s := range in {
		wholeConv[s] = tp.CausalConvSiLU(x[s], w).Float32s()
		e := in[s]
		wholeRule[s] = tp.GatedDeltaRuleRecurrent(e.q, e.k, e.v, e.g, e.beta, scale, 64).Float32s()
	}
	convState := [2][]float32{make([]float32, (k-1)*c), make([]float32, (k-1)*c)}
	ruleState := [2][]float32{make([]float32, heads*dk*dv), make([]float32, heads*dk*dv)}
	pos := [2]int{}
	for _, n := range [][2]int{{2, 1}, {1, 3}, {3, 2}, {1, 1}} {
		var xs, qs, ks, vs, gs, bs []*Tensor
		var convRuns, ruleRuns []RecurrentRun
		for s := range 2 {
			nar := func(a *Tensor) *Tensor { return tp.Narrow(a, 1, pos[s], n[s]) }
			xs = append(xs, nar(x[s]))
			e := in[s]
			qs, ks, vs, gs, bs = append(qs, nar(e.q)), append(ks, nar(e.k)), append(vs, nar(e.v)), append(gs, nar(e.g)), append(bs, nar(e.beta))
			convRuns = append(convRuns, RecurrentRun{Tokens: n[s], State: convState[s]})
			ruleRuns = append(ruleRuns, RecurrentRun{Tokens: n[s], State: ruleState[s]})
		}
		conv := tp.CausalConvSiLURuns(tp.Concat(1, xs...), w, convRuns).Float32s()
		rule := tp.GatedDeltaRuleRuns(tp.Concat(1, qs...), tp.Concat(1, ks...), tp.Concat(1, vs...), tp.Concat(1, gs...),
			tp.Concat(1, bs...), scale, ruleRuns).Float32s()
		r0 := 0
		for s := range 2 {
			for i := range n[s] * c {
				if got, want := conv[r0*c+i], wholeConv[s][pos[s]*c+i]; got != want {
					t.Fatalf("sequence %d conv at token %d: %v, whole %v", s, pos[s]+i/c, got, want)
				}
			}
			for i := range n[s] * heads * dv {
				if got, want := rule[r0*heads*dv+i], wholeRule[s][pos[s]*heads*dv+i]; got != want {
					t.Fatalf("sequence %d delta rule at token %d: %v, whole %v", s, pos[s]+i/(heads*dv), got, want)
				}
			}
			r0 += n[s]
			pos[s] += n[s]
		}
	}
	// runs that do not cover the tokens fail the tape
	bad := NewNoGradTape(nil)
	bad.CausalConvSiLURuns(x[0], w, []RecurrentRun{{Tokens: 3, State: convState[0]}})
	if err := bad.Err(); err == nil || !strings.Contains(err.Error(), "runs of 3 tokens for 7") {
		t.Fatalf("short runs: %v", err)
	}
}

// TestGDNRunsStateOnAnotherDevice: a run whose state tensor is not on the
// step's device, or is not float32, fails the tape naming the run and the
// devices instead of reading the wrong memory.
func TestGDNRunsStateOnAnotherDevice(t *testing.T) {
	const n, c, k = 2, 3, 2
	x, w := New(Float32, 1, n, c), New(Float32, c, k)
	for _, st := range []*Tensor{ZerosOn(Sim, (k-1)*c), New(Int32, (k-1)*c)} {
		tp := NewTape()
		tp.CausalConvSiLURuns(x, w, []RecurrentRun{{Tokens: n, Dev: st}})
		if err := tp.Err(); err == nil || !strings.Contains(err.Error(), "run 0's state") || !strings.Contains(err.Error(), "the step's device") {
			t.Errorf("state %v on %v: %v, want an error naming run 0 and the step's device", st, st.Device(), err)
		}
	}
	tp := NewTape() // the same state on the step's device runs
	tp.CausalConvSiLURuns(x, w, []RecurrentRun{{Tokens: n, Dev: ZerosOn(CPU, (k-1)*c)}})
	if err := tp.Err(); err != nil {
		t.Fatal(err)
	}
}
