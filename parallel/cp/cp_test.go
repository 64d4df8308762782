package cp

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

func TestPositions(t *testing.T) {
	// Megatron's get_batch_on_this_cp_rank, CP=4, S=16 (spec §7.1)
	want := [][]int{{0, 1, 14, 15}, {2, 3, 12, 13}, {4, 5, 10, 11}, {6, 7, 8, 9}}
	for r, w := range want {
		got, err := Positions(16, 4, r)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("Positions(16, 4, %d) = %v, %v; want %v", r, got, err, w)
		}
	}
	if _, err := Positions(18, 4, 0); err == nil {
		t.Error("Positions(18, 4, 0): want an error (18 is not a multiple of 8)")
	}
}

func TestCheckErrorsNameFlags(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{Check(2, P2P, 130, 4, 4, 1), "--seq-length=130 is not divisible by 2×--context-parallel-size = 4"},
		{Check(4, A2A, 128, 6, 6, 1), "--num-attention-heads=6"},
		{Check(2, A2A, 128, 4, 1, 1), "--num-query-groups=1"},
		{Check(2, A2A, 128, 4, 4, 4), "--tensor-model-parallel-size=4 = 1 heads per rank are not divisible by --context-parallel-size=2"},
		{CheckHierarchical([]int{2, 3}, 4, A2AP2P, 4, 4, 1), "multiply to 6, not --context-parallel-size=4"},
		{CheckHierarchical([]int{2, 2}, 4, P2P, 4, 4, 1), "needs --cp-comm-type a2a+p2p"},
		{CheckHierarchical(nil, 4, A2AP2P, 4, 4, 1), "needs --hierarchical-context-parallel-sizes"},
		{CheckHierarchical([]int{4, 1}, 4, A2AP2P, 4, 2, 1), "2 query groups per tensor-parallel rank"},
		{CheckHierarchical([]int{2, 2, 1}, 4, A2AP2P, 4, 4, 1), "want two sizes"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("got %v, want it to mention %q", tc.err, tc.want)
		}
	}
	if ct, err := ParseCommType("a2a+p2p"); err != nil || ct != A2AP2P {
		t.Errorf("ParseCommType(a2a+p2p) = %v, %v", ct, err)
	}
	if err := CheckHierarchical([]int{2, 2}, 4, A2AP2P, 4, 2, 1); err != nil {
		t.Errorf("CheckHierarchical(2 2, CP=4, 4 heads, 2 groups) = %v", err)
	}
	if _, err := ParseCommType("ring"); err == nil || !strings.Contains(err.Error(), "--cp-comm-type") {
		t.Errorf("ParseCommType(ring) = %v, want an error naming the flag", err)
	}
	if err := Check(2, A2A, 128, 4, 2, 1); err != nil {
		t.Errorf("Check(CP=2, a2a, 4 heads, 2 groups) = %v", err)
	}
}

// attentionRef64 is float64 attention over whole sequences: q (b, s, hq,
// d), k, v (b, s, hkv, d), causal or not, no dropout; it returns the output
// and the gradients of Σ out·g.
func attentionRef64(q, k, v, g []float64, b, s, hq, hkv, d int, causal bool) (out, dq, dk, dv []float64) {
	out, dq = make([]float64, len(q)), make([]float64, len(q))
	dk, dv = make([]float64, len(k)), make([]float64, len(v))
	scale := 1 / math.Sqrt(float64(d))
	rep := hq / hkv
	p := make([]float64, s)
	for bb := range b {
		for h := range hq {
			kh := h / rep
			for i := range s {
				qi := q[((bb*s+i)*hq+h)*d:][:d]
				m := math.Inf(-1)
				for j := range s {
					p[j] = math.Inf(-1)
					if causal && j > i {
						continue
					}
					kj := k[((bb*s+j)*hkv+kh)*d:][:d]
					dot := 0.0
					for e := range d {
						dot += qi[e] * kj[e]
					}
					p[j] = dot * scale
					m = math.Max(m, p[j])
				}
				sum := 0.0
				for j := range s {
					p[j] = math.Exp(p[j] - m)
					sum += p[j]
				}
				oi, gi := out[((bb*s+i)*hq+h)*d:][:d], g[((bb*s+i)*hq+h)*d:][:d]
				dp := make([]float64, s)
				sumPdP := 0.0
				for j := range s {
					p[j] /= sum
					vj := v[((bb*s+j)*hkv+kh)*d:][:d]
					for e := range d {
						oi[e] += p[j] * vj[e]
						dp[j] += gi[e] * vj[e]
					}
					sumPdP += p[j] * dp[j]
				}
				for j := range s {
					if p[j] == 0 {
						continue
					}
					ds := p[j] * (dp[j] - sumPdP) * scale
					kj, off := k[((bb*s+j)*hkv+kh)*d:][:d], ((bb*s+j)*hkv+kh)*d
					for e := range d {
						dv[off+e] += p[j] * gi[e]
						dq[((bb*s+i)*hq+h)*d+e] += ds * kj[e]
						dk[off+e] += ds * qi[e]
					}
				}
			}
		}
	}
	return out, dq, dk, dv
}

// localRows returns rank's tokens (Positions' order) of x (b, s, h, d).
func localRows(x []float32, b, s, hd, size, rank int) []float32 {
	pos, err := Positions(s, size, rank)
	if err != nil {
		panic(err)
	}
	out := make([]float32, 0, b*len(pos)*hd)
	for bb := range b {
		for _, p := range pos {
			out = append(out, x[(bb*s+p)*hd:][:hd]...)
		}
	}
	return out
}

type cpCase struct {
	b, s, hq, hkv, d int
	causal           bool
	dropout          float32
	a2a              int // the a2a size of A2AP2P
}

// runCP runs context-parallel attention of the whole-sequence inputs over
// size inproc ranks and returns the output and gradients of Σ out·g,
// reassembled in sequence order.
func runCP(t *testing.T, ct CommType, size int, tc cpCase, q, k, v, g []float32) (out, dq, dk, dv []float32) {
	t.Helper()
	qs, ks := tc.hq*tc.d, tc.hkv*tc.d
	out, dq = make([]float32, len(q)), make([]float32, len(q))
	dk, dv = make([]float32, len(k)), make([]float32, len(v))
	var mu sync.Mutex
	err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
		r := pg.Rank()
		lc := tc.s / size
		mk := func(name string, x []float32, hd, h int) *tensor.Tensor {
			p := tensor.Param(name, tc.b, lc, h, tc.d)
			copy(p.Float32s(), localRows(x, tc.b, tc.s, hd, size, r))
			return p
		}
		lq, lk, lv := mk("q", q, qs, tc.hq), mk("k", k, ks, tc.hkv), mk("v", v, ks, tc.hkv)
		tp := tensor.NewTape()
		tp.SetContext(ctx)
		a := &Attention{Group: pg, Comm: ct}
		if ct == A2AP2P {
			world := make([]int, size)
			for i := range world {
				world[i] = i
			}
			inner, ring, err := HierarchicalRanks(world, r, tc.a2a, size/tc.a2a)
			if err != nil {
				return err
			}
			if a.A2AGroup, err = pg.NewGroup(inner); err != nil {
				return err
			}
			if a.RingGroup, err = pg.NewGroup(ring); err != nil {
				return err
			}
		}
		o := tensor.AttentionOptions{Causal: tc.causal}
		if tc.dropout > 0 {
			o.Dropout, o.RNG = tc.dropout, tensor.NewRNG(5)
		}
		lo := a.Attention(tp, lq, lk, lv, o)
		lg := tensor.FromFloat32(localRows(g, tc.b, tc.s, qs, size, r), tc.b, lc, tc.hq, tc.d)
		if err := tp.BackwardFrom([]*tensor.Tensor{lo}, []*tensor.Tensor{lg}); err != nil {
			return err
		}
		pos, _ := Positions(tc.s, size, r)
		mu.Lock()
		defer mu.Unlock()
		put := func(dst []float32, src *tensor.Tensor, hd int) {
			x := src.Contiguous().Float32s()
			for bb := range tc.b {
				for i, p := range pos {
					copy(dst[(bb*tc.s+p)*hd:][:hd], x[(bb*lc+i)*hd:][:hd])
				}
			}
		}
		put(out, lo, qs)
		put(dq, lq.Grad, qs)
		put(dk, lk.Grad, ks)
		put(dv, lv.Grad, ks)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out, dq, dk, dv
}

// runOne is single-rank attention (tensor.Tape.Attention) over the whole
// sequence.
func runOne(t *testing.T, tc cpCase, q, k, v, g []float32) (out, dq, dk, dv []float32) {
	t.Helper()
	mk := func(name string, x []float32, h int) *tensor.Tensor {
		p := tensor.Param(name, tc.b, tc.s, h, tc.d)
		copy(p.Float32s(), x)
		return p
	}
	wq, wk, wv := mk("q", q, tc.hq), mk("k", k, tc.hkv), mk("v", v, tc.hkv)
	tp := tensor.NewTape()
	o := tensor.AttentionOptions{Causal: tc.causal}
	if tc.dropout > 0 {
		o.Dropout, o.RNG = tc.dropout, tensor.NewRNG(5)
	}
	wo := tp.Attention(wq, wk, wv, o)
	if err := tp.BackwardFrom([]*tensor.Tensor{wo}, []*tensor.Tensor{tensor.FromFloat32(g, tc.b, tc.s, tc.hq, tc.d)}); err != nil {
		t.Fatal(err)
	}
	cp := func(x *tensor.Tensor) []float32 { return append([]float32(nil), x.Contiguous().Float32s()...) }
	return cp(wo), cp(wq.Grad), cp(wk.Grad), cp(wv.Grad)
}

func assertNear(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > tol*math.Max(1, math.Abs(want[i])) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %.8g, want %.8g (|diff| %.3g > %g)", what, i, got[i], want[i], d, tol)
		}
	}
}

func to64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// TestContextParallelAttentionMatchesOneRank: every --cp-comm-type at C = 2,
// 3 and 4 over inproc ranks gives the single-rank attention of the whole
// sequence, forward and backward: against float64 attention without
// dropout; with dropout against the single-rank kernel (the masks keyed by
// sequence position and global head are the same, so CP drops exactly what
// one rank drops). Odd chunk lengths, GQA, causal and not.
func TestContextParallelAttentionMatchesOneRank(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 9))
	rnd := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	for _, tc := range []struct {
		ct   CommType
		size int
		cpCase
	}{
		{P2P, 2, cpCase{b: 2, s: 20, hq: 4, hkv: 2, d: 8, causal: true}},                     // chunks of 5
		{P2P, 3, cpCase{b: 1, s: 42, hq: 2, hkv: 1, d: 4, causal: true}},                     // odd ring, chunks of 7
		{P2P, 4, cpCase{b: 1, s: 136, hq: 2, hkv: 2, d: 8, causal: true}},                    // chunks of 17
		{P2P, 2, cpCase{b: 1, s: 12, hq: 2, hkv: 2, d: 4, causal: false}},                    // bidirectional
		{P2P, 2, cpCase{b: 2, s: 36, hq: 4, hkv: 2, d: 8, causal: true, dropout: 0.2}},       // dropout
		{P2P, 3, cpCase{b: 1, s: 30, hq: 2, hkv: 1, d: 4, causal: true, dropout: 0.3}},       //
		{AllGather, 2, cpCase{b: 2, s: 20, hq: 4, hkv: 2, d: 8, causal: true}},               //
		{AllGather, 3, cpCase{b: 1, s: 42, hq: 2, hkv: 1, d: 4, causal: true, dropout: 0.1}}, //
		{A2A, 2, cpCase{b: 2, s: 20, hq: 4, hkv: 2, d: 8, causal: true}},                     //
		{A2A, 2, cpCase{b: 1, s: 28, hq: 4, hkv: 2, d: 4, causal: true, dropout: 0.2}},       //
		{A2A, 4, cpCase{b: 1, s: 40, hq: 4, hkv: 4, d: 4, causal: true}},                     //
	} {
		t.Run(fmt.Sprintf("%v-C%d-A%d-s%d-hq%d-hkv%d-causal%v-drop%g", tc.ct, tc.size, tc.a2a, tc.s, tc.hq, tc.hkv, tc.causal, tc.dropout), func(t *testing.T) {
			nq, nkv := tc.b*tc.s*tc.hq*tc.d, tc.b*tc.s*tc.hkv*tc.d
			q, k, v, g := rnd(nq), rnd(nkv), rnd(nkv), rnd(nq)
			out, dq, dk, dv := runCP(t, tc.ct, tc.size, tc.cpCase, q, k, v, g)
			var wo, wdq, wdk, wdv []float64
			if tc.dropout == 0 {
				wo, wdq, wdk, wdv = attentionRef64(to64(q), to64(k), to64(v), to64(g), tc.b, tc.s, tc.hq, tc.hkv, tc.d, tc.causal)
			} else {
				o1, q1, k1, v1 := runOne(t, tc.cpCase, q, k, v, g)
				wo, wdq, wdk, wdv = to64(o1), to64(q1), to64(k1), to64(v1)
			}
			const tol = 2e-5
			assertNear(t, "out", out, wo, tol)
			assertNear(t, "dq", dq, wdq, tol)
			assertNear(t, "dk", dk, wdk, tol)
			assertNear(t, "dv", dv, wdv, tol)
		})
	}
}
