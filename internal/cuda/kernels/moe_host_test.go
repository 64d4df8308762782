package kernels_test

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
)

// TestMoEHostKernels runs moe.cu's router kernels on the host
// (testdata/moe_host.cc, built with g++ without fused multiply-adds)
// against internal/cpu's router, bit for bit: the chosen experts (the
// routing map), the probabilities and the logits' gradient, for softmax
// after and before the top-k, sigmoid with k 1 and 3, the expert bias,
// group-limited top-k and the scaling factor, on logits with many ties
// (rounded to a few values: the CPU's order, lowest index first, must
// hold) and extreme ones (underflowing softmax terms, saturated sigmoids:
// equal scores from different logits). This checks the kernels' logic
// and arithmetic without a GPU; nvcc's code for them (built with the
// __d*_rn intrinsics, so no contraction: TestMoEPTXHasNoFMA) only a GPU
// run checks.
func TestMoEHostKernels(t *testing.T) {
	bias := func(e int) []float32 {
		b := make([]float32, e)
		tensor.NewRNG(8).Normal(b, 0, 0.1)
		return b
	}
	for _, c := range []struct {
		name  string
		rc    cpu.RouterConfig
		logit func(i int, x float32) float32
	}{
		{name: "softmax-topk-ties", rc: cpu.RouterConfig{Experts: 8, TopK: 2}, logit: func(_ int, x float32) float32 { return float32(math.Round(float64(x))) }},
		{name: "softmax-scaled", rc: cpu.RouterConfig{Experts: 16, TopK: 4, ScalingFactor: 2.5}},
		{name: "pre-softmax-extreme", rc: cpu.RouterConfig{Experts: 16, TopK: 4, PreSoftmax: true}, logit: func(i int, x float32) float32 {
			if i%5 == 0 {
				return x * 400 // terms of e^(v − max) that underflow to 0: ties among them
			}
			return x
		}},
		{name: "sigmoid-top1", rc: cpu.RouterConfig{Experts: 8, TopK: 1, Score: cpu.ScoreSigmoid}},
		{name: "sigmoid-saturated", rc: cpu.RouterConfig{Experts: 8, TopK: 3, Score: cpu.ScoreSigmoid}, logit: func(i int, x float32) float32 {
			if i%3 == 0 {
				return 38 + x*4 // sigmoid rounds to 1 from about 37: equal scores
			}
			return x
		}},
		{name: "sigmoid-bias-groups", rc: cpu.RouterConfig{Experts: 16, TopK: 4, Score: cpu.ScoreSigmoid, NumGroups: 4, GroupTopK: 2,
			ExpertBias: bias(16), ScalingFactor: 2.5}, logit: func(_ int, x float32) float32 { return float32(math.Round(float64(x)*2) / 2) }},
		{name: "softmax-groups-ties", rc: cpu.RouterConfig{Experts: 12, TopK: 4, NumGroups: 3, GroupTopK: 2}, logit: func(_ int, x float32) float32 { return float32(math.Round(float64(x))) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const T = 203
			rc := c.rc
			E, k := rc.Experts, rc.TopK
			logits, dprobs := make([]float32, T*E), make([]float32, T*E)
			rng := tensor.NewRNG(uint64(len(c.name)))
			rng.Normal(logits, 0, 2)
			rng.Normal(dprobs, 0, 1)
			if c.logit != nil {
				for i, x := range logits {
					logits[i] = c.logit(i, x)
				}
			}
			want := cpu.Route(&rc, logits)
			wantD := make([]float32, T*E)
			cpu.RouteBackward(&rc, want, dprobs, 0, wantD)

			score, pre := 0, 0
			if rc.Score == cpu.ScoreSigmoid {
				score = 1
			}
			if rc.PreSoftmax {
				pre = 1
			}
			sc := strconv.FormatFloat(rc.ScalingFactor, 'g', 17, 64)
			in := leBytes(logits)
			hasBias := "0"
			if rc.ExpertBias != nil {
				in, hasBias = append(in, leBytes(rc.ExpertBias)...), "1"
			}
			out := moeHost.run(t, in, "fwd", T, E, k, score, pre, rc.NumGroups, rc.GroupTopK, sc, hasBias)
			if len(out) != 4*(T*E+T*k) {
				t.Fatalf("fwd wrote %d bytes, want %d", len(out), 4*(T*E+T*k))
			}
			probs, sel := fromLE[float32](out[:4*T*E]), fromLE[int32](out[4*T*E:])
			for tok := range T {
				for e := range E {
					in := false
					for _, s := range sel[tok*k : (tok+1)*k] {
						in = in || int(s) == e
					}
					if in != want.Map[tok*E+e] {
						t.Fatalf("token %d expert %d: chosen %v, the CPU's %v (logits %v)", tok, e, in, want.Map[tok*E+e], logits[tok*E:(tok+1)*E])
					}
				}
			}
			sameBitsF32(t, "probabilities", probs, want.Probs)
			out = moeHost.run(t, append(append(leBytes(logits), leBytes(sel)...), leBytes(dprobs)...), "bwd", T, E, k, score, pre, sc, 1, 0, 0, 0, 0)
			sameBitsF32(t, "logits' gradient", fromLE[float32](out), wantD)
		})
	}
}

// TestMoEHostKernelsLosses: with the load-balancing losses (aux, seq-aux,
// global-aux) and the z-loss, the host run of moe.cu's aux and z kernels
// gives the routing the CPU's aux-loss counts (per expert and per
// sequence), load-balancing loss values within float64 rounding and the
// z-loss bit for bit, and the backward with the losses' gradient
// (LossGradients of that routing, at a scale, and the z-loss's) gives the
// CPU's logits' gradient bit for bit, softmax and sigmoid, on logits with
// ties; also the z-loss alone (no load-balancing loss: the backward adds
// the CPU's zeros).
func TestMoEHostKernelsLosses(t *testing.T) {
	const B, S, E, k = 3, 37, 8, 2
	T := B * S
	all := []cpu.LoadBalancing{{Coeff: 0.01}, {Seq: true, Coeff: 0.02}, {Global: true, Coeff: 0.03}}
	for _, c := range []struct {
		name  string
		score cpu.ScoreFunction
		bal   []cpu.LoadBalancing
		z     float64
	}{
		{"softmax-balancing", cpu.ScoreSoftmax, all, 0},
		{"sigmoid-balancing", cpu.ScoreSigmoid, all, 0},
		{"softmax-balancing-z", cpu.ScoreSoftmax, all, 0.05},
		{"sigmoid-balancing-z", cpu.ScoreSigmoid, all, 1e-3},
		{"softmax-z-only", cpu.ScoreSoftmax, nil, 0.3},
		{"sigmoid-z-only", cpu.ScoreSigmoid, nil, 0.3},
	} {
		score := c.score
		rc := cpu.RouterConfig{Experts: E, TopK: k, Score: score, Losses: true, Batch: B, SeqLen: S, Balancing: c.bal, ZLossCoeff: c.z}
		logits, dprobs := make([]float32, T*E), make([]float32, T*E)
		rng := tensor.NewRNG(uint64(score) + 11)
		rng.Normal(logits, 0, 2)
		rng.Normal(dprobs, 0, 1)
		for i, x := range logits {
			if i%7 == 0 {
				logits[i] = x * 60 // softmax terms that underflow, sigmoids that saturate
			} else {
				logits[i] = float32(math.Round(float64(x)))
			}
		}
		want := cpu.Route(&rc, logits)
		const scale = 0.75
		wantD := make([]float32, T*E)
		cpu.RouteBackward(&rc, want, dprobs, scale, wantD)

		sc := strconv.FormatFloat(rc.ScalingFactor, 'g', 17, 64)
		out := moeHost.run(t, leBytes(logits), "fwd", T, E, k, int(score), 0, 0, 0, sc, "0")
		sel := fromLE[int32](out[4*T*E:])
		out = moeHost.run(t, leBytes(logits), "aux", B, S, E, k, int(score))
		auxSel := fromLE[int32](out[:4*T*k])
		sums := fromLE[float64](out[4*T*k:])
		out = moeHost.run(t, leBytes(logits), "z", T, E)
		zs := fromLE[float64](out)
		if len(sums) != B*E || len(zs) != T+1 {
			t.Fatalf("%s: %d sums and %d z terms, want %d and %d", c.name, len(sums), len(zs), B*E, T+1)
		}
		// what the device reads back: the token counts (moe_perm_*), the
		// aux-loss map's counts per sequence, the sums and the z sum
		counts := fromLE[int32](moeHost.run(t, leBytes(sel), "perm", T, E, k, 128))[:E]
		seqAux := fromLE[int32](moeHost.run(t, leBytes(auxSel), "auxcounts", B, S, E, k))
		got, err := cpu.RouteFromCounts(&rc, T, counts, seqAux, sums, zs[T])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.TokensPerExpert, want.TokensPerExpert) {
			t.Fatalf("%s: token counts %v, the CPU's %v", c.name, got.TokensPerExpert, want.TokensPerExpert)
		}
		if !slices.Equal(got.AuxCounts(&rc), want.AuxCounts(&rc)) || !slices.Equal(got.SeqAuxCounts(&rc), want.SeqAuxCounts(&rc)) {
			t.Fatalf("%s: aux-loss counts %v, %v; the CPU's %v, %v", c.name, got.AuxCounts(&rc), got.SeqAuxCounts(&rc), want.AuxCounts(&rc), want.SeqAuxCounts(&rc))
		}
		ga, wa := got.Aux, want.Aux
		for i := range wa {
			if d := math.Abs(ga[i] - wa[i]); d > 1e-13*math.Abs(wa[i]) {
				t.Errorf("%s: loss %d = %v, the CPU's %v", c.name, i, ga[i], wa[i])
			}
		}
		if math.Float64bits(got.Z) != math.Float64bits(want.Z) || (c.z != 0) != (want.Z != 0) {
			t.Errorf("%s: z-loss %v, the CPU's %v", c.name, got.Z, want.Z)
		}
		dsc := got.LossGradients(&rc, scale)
		zloss, zc := 0, strconv.FormatFloat(scale*rc.ZLossCoeff, 'g', 17, 64)
		if rc.ZLossCoeff != 0 {
			zloss = 1
		}
		out = moeHost.run(t, append(append(append(leBytes(logits), leBytes(sel)...), leBytes(dprobs)...), leBytes(dsc)...), "bwd", T, E, k, int(score), 0, sc, S,
			len(dsc)/E, 1, zloss, zc)
		sameBitsF32(t, c.name+": logits' gradient with the losses", fromLE[float32](out), wantD)
	}
}

// TestMoEHostPermutation: moe.cu's permutation kernels, run on the host on
// the device router's selection, give tensor's Routing.Permutation of the
// CPU's routing exactly (the rows expert-major and ascending within an
// expert, each row's probability index, the counts), whatever the chunk
// of tokens a thread takes (1, 7, 128, all; T not a multiple of it), with
// experts no token chooses and with every expert chosen by every token.
func TestMoEHostPermutation(t *testing.T) {
	for _, c := range []struct {
		name    string
		T, E, k int
		starve  int // experts from this one on get logits −100 (0: none)
	}{
		{"top2", 203, 8, 2, 0},
		{"top1-starved", 1000, 16, 1, 10},
		{"all-experts", 50, 4, 4, 0},
		{"top3-starved", 389, 12, 3, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			T, E, k := c.T, c.E, c.k
			logits := make([]float32, T*E)
			tensor.NewRNG(uint64(T)).Normal(logits, 0, 2)
			for i := range logits {
				if c.starve > 0 && i%E >= c.starve {
					logits[i] = -100
				}
			}
			rc := cpu.RouterConfig{Experts: E, TopK: k}
			_, r := tensor.NewTape().Route(tensor.FromFloat32(logits, T, E), &rc)
			wantRows, wantFlat, wantCounts := r.Permutation()
			sel := moeHost.run(t, leBytes(logits), "fwd", T, E, k, 0, 0, 0, 0, "0", "0")[4*T*E:]
			for _, chunk := range []int{1, 7, 128, T} {
				v := fromLE[int32](moeHost.run(t, sel, "perm", T, E, k, chunk))
				if len(v) != E+2*T*k {
					t.Fatalf("chunk %d: perm wrote %d values, want %d", chunk, len(v), E+2*T*k)
				}
				counts, rows, flat := v[:E], v[E:E+T*k], v[E+T*k:]
				for e, n := range wantCounts {
					if int(counts[e]) != n {
						t.Fatalf("chunk %d: expert %d has %d rows, the CPU's %d", chunk, e, counts[e], n)
					}
				}
				if !slices.Equal(rows, wantRows) || !slices.Equal(flat, wantFlat) {
					t.Fatalf("chunk %d: rows %v… flat %v…, the CPU's %v… %v…", chunk, rows[:min(12, len(rows))], flat[:min(12, len(flat))],
						wantRows[:min(12, len(wantRows))], wantFlat[:min(12, len(wantFlat))])
				}
			}
			if c.starve > 0 && wantCounts[E-1] != 0 {
				t.Fatalf("expert %d was to have no tokens, has %d", E-1, wantCounts[E-1])
			}
		})
	}
}

// TestMoEHostLog: moe.cu's moe_log is internal/cpu's RouterLog bit for bit
// (each within an ulp of log x) on the z-loss's range (sums of 1 to E
// terms in [0, 1]), far beyond it, at the reduction's boundary √2/2 and its
// neighbours, on subnormals and the special cases.
func TestMoEHostLog(t *testing.T) {
	h := math.Sqrt2 / 2
	x := []float64{0, math.Copysign(0, -1), 1, -1, 2, 0.5, h, math.Nextafter(h, 0), math.Nextafter(h, 1), 2 * h, math.Nextafter(2*h, 0),
		5e-324, 1e-310, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN()}
	u := make([]float32, 200000)
	tensor.NewRNG(5).Uniform(u, 0, 1)
	for i, v := range u {
		switch i % 4 {
		case 0:
			x = append(x, 1+float64(v)*255)
		case 1:
			x = append(x, float64(v)*float64(u[(i+1)%len(u)]))
		case 2:
			x = append(x, math.Exp((float64(v)*2-1)*700))
		default:
			x = append(x, h*(1+(float64(v)-0.5)*1e-6))
		}
	}
	got := fromLE[float64](moeHost.run(t, leBytes(x), "log", len(x)))
	if len(got) != len(x) {
		t.Fatalf("moe_log of %d values gave %d", len(x), len(got))
	}
	for i, v := range x {
		want := cpu.RouterLog(v)
		if math.Float64bits(got[i]) != math.Float64bits(want) && !(math.IsNaN(got[i]) && math.IsNaN(want)) {
			t.Fatalf("moe_log(%v) = %v, RouterLog %v", v, got[i], want)
		}
	}
}

// TestMoEHostExp: moe.cu's moe_exp is internal/cpu's RouterExp bit for bit
// (each of them within an ulp of e^x; amd64's math.Exp, which uses FMA
// where the CPU has it, is not the same function) over the range the
// router's scores reach and the special cases.
func TestMoEHostExp(t *testing.T) {
	x := []float64{0, math.Copysign(0, -1), 1, -1, 1e-9, -1e-9, 700, -700, 709.78, 709.79, -745.1, -745.2, -744.5, math.Inf(1), math.Inf(-1)}
	u := make([]float32, 200000)
	tensor.NewRNG(3).Uniform(u, -1, 1)
	for i, v := range u {
		x = append(x, float64(v)*float64([]float32{1, 40, 750}[i%3]))
	}
	got := fromLE[float64](moeHost.run(t, leBytes(x), "exp", len(x)))
	if len(got) != len(x) {
		t.Fatalf("moe_exp of %d values gave %d", len(x), len(got))
	}
	for i, v := range x {
		if want := cpu.RouterExp(v); math.Float64bits(got[i]) != math.Float64bits(want) {
			t.Fatalf("moe_exp(%v) = %v, RouterExp %v", v, got[i], want)
		}
	}
}

// TestMoEPTXHasNoFMA: moe.cu's PTX has no floating-point fused
// multiply-add (every operation an __d*_rn intrinsic), so the GPU rounds
// each as the CPU does; the permutation's integer index arithmetic
// (mad.lo.s32) is exact and allowed.
func TestMoEPTXHasNoFMA(t *testing.T) {
	fused := regexp.MustCompile(`\b(fma|mad)(\.[a-z]+)*\.f(16|32|64)\b`)
	for _, arch := range []string{"sm_80", "sm_90"} {
		b, err := os.ReadFile(filepath.Join("ptx", arch, "moe.ptx"))
		if err != nil {
			t.Fatal(err)
		}
		if m := fused.Find(b); m != nil {
			t.Errorf("%s/moe.ptx has a fused multiply-add: %s", arch, m)
		}
	}
	if !fused.MatchString("\tfma.rn.f64 \t%fd1, %fd2, %fd3, %fd4;") || !fused.MatchString("mad.f32") || fused.MatchString("mad.lo.s32") {
		t.Fatal("the fused multiply-add pattern does not tell them apart")
	}
}
