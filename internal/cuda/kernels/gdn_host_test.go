package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
)

// The gated delta net's kernels beyond the convolution (gdn.cu: L2Norm,
// the gates, the delta rule forward and backward, the decoding runs), run
// on the host by hostcheck in the order tensor/cuda_backend_gdn.go
// launches them, against internal/cpu's functions.

// hexIn writes arrays as hostcheck's input: float32 bits in hex, a line
// each.
func hexIn(arrays ...[]float32) string {
	var b strings.Builder
	for _, a := range arrays {
		for _, v := range a {
			fmt.Fprintf(&b, "%x\n", math.Float32bits(v))
		}
	}
	return b.String()
}

// hexOut parses hostcheck's output lines into float32s.
func hexOut(t *testing.T, lines []string) []float32 {
	t.Helper()
	out := make([]float32, len(lines))
	for i, l := range lines {
		var u uint32
		if _, err := fmt.Sscanf(l, "%x", &u); err != nil {
			t.Fatalf("hostcheck line %d %q: %v", i, l, err)
		}
		out[i] = math.Float32frombits(u)
	}
	return out
}

func normals(rng *rand.Rand, n int, std float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * std)
	}
	return v
}

// compareParts checks got against the named parts of want: bit for bit
// when exact, else equal but for at most 3 in a thousand values (at least
// one) within 4 ulps of the CPU's (the host's float64 exp and log1p and
// Go's may differ in the last bit, which can move a float32 rounding).
func compareParts(t *testing.T, got []float32, exact bool, names []string, want ...[]float32) {
	t.Helper()
	n := 0
	for _, w := range want {
		n += len(w)
	}
	if len(got) != n {
		t.Fatalf("hostcheck printed %d values, want %d", len(got), n)
	}
	differ, off := 0, 0
	for p, w := range want {
		for i, x := range w {
			g := got[off+i]
			if math.Float32bits(g) == math.Float32bits(x) {
				continue
			}
			differ++
			ulps := int64(math.Float32bits(g)) - int64(math.Float32bits(x))
			if exact || g*x <= 0 || ulps > 4 || ulps < -4 {
				t.Fatalf("%s[%d]: the kernel's %v, the CPU's %v", names[p], i, g, x)
			}
		}
		off += len(w)
	}
	if differ > max(1, 3*n/1000) {
		t.Errorf("%d of %d values differ from the CPU's: more than the float64 exp's last bit explains", differ, n)
	}
}

// TestHostL2Norm: gdn.cu's L2Norm forward and backward (accumulating into
// a non-zero dx) equal internal/cpu's bit for bit.
func TestHostL2Norm(t *testing.T) {
	for _, c := range []struct{ n, d int }{{7, 16}, {3, 1}, {5, 33}} {
		rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.d)))
		x, dy, dx := normals(rng, c.n*c.d, 1.5), normals(rng, c.n*c.d, 1), normals(rng, c.n*c.d, 1)
		x[0] = 0 // a zero entry; eps keeps the row finite
		in := hexIn(x, dy, dx)
		out := make([]float32, len(x))
		cpu.L2NormForward(out, x, c.n, c.d, 1e-6)
		cpu.L2NormBackward(dx, dy, x, c.n, c.d, 1e-6)
		got := hexOut(t, runHostcheck(t, in, "gdnl2", c.n, c.d, "1e-6"))
		compareParts(t, got, true, []string{"out", "dx"}, out, dx)
	}
}

// TestHostGDNGates: the gates' forward, backward and per-head sums
// (accumulating into non-zero gradients; some alpha+dt_bias past
// softplus's threshold of 20) against internal/cpu's.
func TestHostGDNGates(t *testing.T) {
	rows, h := 37, 5
	rng := rand.New(rand.NewPCG(3, 4))
	n := rows * h
	alpha, b, aLog, dtBias := normals(rng, n, 3), normals(rng, n, 2), normals(rng, h, 0.5), normals(rng, h, 1)
	alpha[3], alpha[9] = 25, 19.5
	dg, dbeta, dalpha, db, daLog, ddtBias := normals(rng, n, 1), normals(rng, n, 1), normals(rng, n, 1), normals(rng, n, 1), normals(rng, h, 1), normals(rng, h, 1)
	in := hexIn(alpha, b, aLog, dtBias, dg, dbeta, dalpha, db, daLog, ddtBias)
	g, beta := make([]float32, n), make([]float32, n)
	cpu.GDNGatesForward(g, beta, alpha, b, aLog, dtBias, rows, h)
	cpu.GDNGatesBackward(dalpha, db, daLog, ddtBias, dg, dbeta, alpha, b, aLog, dtBias, rows, h)
	got := hexOut(t, runHostcheck(t, in, "gdngates", rows, h))
	compareParts(t, got, false, []string{"g", "beta", "dalpha", "db", "daLog", "ddtBias"}, g, beta, dalpha, db, daLog, ddtBias)
}

// TestHostGatedDeltaRule: the delta rule's kernels — forward, then per
// chunk from the last the states, the columns' sweep and the rows' and
// steps' sums, with the key heads repeated and folded back — equal
// internal/cpu's recurrent GatedDeltaRuleForward (output and saved states)
// and GatedDeltaRuleBackward bit for bit: chunks that do and do not divide
// T, GQA, several sequences.
func TestHostGatedDeltaRule(t *testing.T) {
	for _, c := range []struct{ b, t, h, kh, dk, dv, chunk int }{
		{1, 9, 2, 2, 4, 3, 4}, {2, 8, 4, 2, 3, 5, 8}, {2, 5, 3, 1, 6, 2, 2}, {1, 7, 2, 2, 5, 4, 16},
	} {
		t.Run(fmt.Sprintf("b%d-t%d-h%d-kh%d-dk%d-dv%d-chunk%d", c.b, c.t, c.h, c.kh, c.dk, c.dv, c.chunk), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.t), uint64(c.h*c.dk)))
			rows := c.b * c.t
			q, k := normals(rng, rows*c.kh*c.dk, 0.5), normals(rng, rows*c.kh*c.dk, 0.5)
			v, dout := normals(rng, rows*c.h*c.dv, 1), normals(rng, rows*c.h*c.dv, 1)
			g, beta := make([]float32, rows*c.h), make([]float32, rows*c.h)
			for i := range g {
				g[i] = float32(-rng.Float64() * 0.7)
				beta[i] = float32(rng.Float64())
			}
			scale := 1 / math.Sqrt(float64(c.dk))
			s := cpu.DeltaRuleShape{B: c.b, T: c.t, Heads: c.h, DK: c.dk, DV: c.dv, Scale: scale, Chunk: c.chunk}
			qr, kr := repeatHeads(q, rows, c.kh, c.h, c.dk), repeatHeads(k, rows, c.kh, c.h, c.dk)
			out, saved := make([]float32, len(v)), make([]float32, s.SavedStates())
			cpu.GatedDeltaRuleForward(out, saved, qr, kr, v, g, beta, s)
			dqr, dkr, dv, dg, dbeta := make([]float32, len(qr)), make([]float32, len(kr)), make([]float32, len(v)), make([]float32, len(g)), make([]float32, len(g))
			cpu.GatedDeltaRuleBackward(dqr, dkr, dv, dg, dbeta, dout, saved, qr, kr, v, g, beta, s)
			dq, dk := foldHeads(dqr, rows, c.kh, c.h, c.dk), foldHeads(dkr, rows, c.kh, c.h, c.dk)
			lines := runHostcheck(t, hexIn(q, k, v, g, beta, dout), "gdndelta", c.b, c.t, c.h, c.kh, c.dk, c.dv, c.chunk, fmt.Sprint(float32(scale)))
			compareParts(t, hexOut(t, lines), true, []string{"out", "saved", "dq", "dk", "dv", "dg", "dbeta"}, out, saved, dq, dk, dv, dg, dbeta)
		})
	}
}

// repeatHeads and foldHeads are tensor's deltaRule.repeat and fold.
func repeatHeads(x []float32, rows, kh, h, d int) []float32 {
	out := make([]float32, rows*h*d)
	for r := range rows {
		for j := range h {
			copy(out[(r*h+j)*d:(r*h+j+1)*d], x[(r*kh+j/(h/kh))*d:])
		}
	}
	return out
}

func foldHeads(d []float32, rows, kh, h, dim int) []float32 {
	out := make([]float32, rows*kh*dim)
	for r := range rows {
		for j := range h {
			dst := out[(r*kh+j/(h/kh))*dim : (r*kh+j/(h/kh)+1)*dim]
			for i, v := range d[(r*h+j)*dim : (r*h+j+1)*dim] {
				dst[i] += v
			}
		}
	}
	return out
}

// TestHostGDNRuns: the decoding kernels — the convolution and the delta
// rule over runs of several sequences' tokens, each from its own state —
// equal internal/cpu's CausalConvSiLUStateForward and
// GatedDeltaRuleStateForward run by run (outputs and advanced states bit
// for bit, but for the SiLU's float64 exp): runs shorter and longer than
// the convolution's window.
func TestHostGDNRuns(t *testing.T) {
	runs := []int{1, 3, 1, 6, 2}
	c, kw, h, dk, dv := 5, 4, 2, 3, 4
	rng := rand.New(rand.NewPCG(5, 6))
	n := 0
	for _, r := range runs {
		n += r
	}
	hw := kw - 1
	x, w, cs := normals(rng, n*c, 1), normals(rng, c*kw, 0.6), normals(rng, len(runs)*hw*c, 1)
	q, k, v := normals(rng, n*h*dk, 0.5), normals(rng, n*h*dk, 0.5), normals(rng, n*h*dv, 1)
	g, beta := make([]float32, n*h), make([]float32, n*h)
	for i := range g {
		g[i] = float32(-rng.Float64() * 0.5)
		beta[i] = float32(rng.Float64())
	}
	rs := normals(rng, len(runs)*h*dk*dv, 0.3)
	var in strings.Builder
	for _, r := range runs {
		fmt.Fprintf(&in, "%d\n", r)
	}
	in.WriteString(hexIn(x, w, cs, q, k, v, g, beta, rs))
	scale := float32(1 / math.Sqrt(float64(dk)))
	co, ro := make([]float32, n*c), make([]float32, n*h*dv)
	wantCS, wantRS := append([]float32(nil), cs...), append([]float32(nil), rs...)
	r0 := 0
	for i, t := range runs {
		cpu.CausalConvSiLUStateForward(co[r0*c:(r0+t)*c], x[r0*c:(r0+t)*c], w, wantCS[i*hw*c:(i+1)*hw*c], t, c, kw)
		s := cpu.DeltaRuleShape{B: 1, T: t, Heads: h, DK: dk, DV: dv, Scale: float64(scale), Chunk: 1}
		cpu.GatedDeltaRuleStateForward(ro[r0*h*dv:(r0+t)*h*dv], wantRS[i*h*dk*dv:(i+1)*h*dk*dv], q[r0*h*dk:(r0+t)*h*dk], k[r0*h*dk:(r0+t)*h*dk],
			v[r0*h*dv:(r0+t)*h*dv], g[r0*h:(r0+t)*h], beta[r0*h:(r0+t)*h], s)
		r0 += t
	}
	got := hexOut(t, runHostcheck(t, in.String(), "gdnruns", len(runs), c, kw, h, dk, dv, fmt.Sprint(scale)))
	compareParts(t, got, false, []string{"conv out", "conv states", "rule out", "rule states"}, co, wantCS, ro, wantRS)
}
