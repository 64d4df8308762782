package cpu

import (
	"encoding/json"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"
)

// moeGolden is testdata/moe_router.json, written by tools/golden/moe.py from
// Megatron-LM's own moe_utils.py functions.
type moeGolden struct {
	S, B, E int
	Logits  []float64
	DProbs  []float64
	Routes  []struct {
		Name, Score         string
		TopK                int
		PreSoftmax          bool      `json:"pre_softmax"`
		NumGroups           int       `json:"num_groups"`
		GroupTopK           int       `json:"group_topk"`
		Scaling             float64   `json:"scaling"`
		ExpertBias          []float32 `json:"expert_bias"`
		CapacityFactor      float64   `json:"capacity_factor"`
		DropPolicy          string    `json:"drop_policy"`
		Pad                 bool
		Probs, Map, DLogits []float64
	}
	Losses []struct {
		Name, Score, Type    string
		TopK                 int
		Coeff, ZCoeff, Scale float64
		Aux, Z               float64
		DLogits              []float64
	}
	GlobalAux struct {
		TopK         int
		Coeff        float64
		Microbatches []struct {
			Logits, DLogits []float64
			Loss            float64
		}
	} `json:"global_aux"`
	GlobalAuxDP struct {
		TopK, Ranks  int
		Coeff, Scale float64
		Microbatches [][]struct { // [micro-batch][rank]
			Logits, DLogits []float64
			Loss            float64
		}
	} `json:"global_aux_dp"`
	ExpertBias struct {
		Counts  []float64
		Bias    []float32
		Rate    float64
		Updated []float32
	} `json:"expert_bias"`
	Capacity [][4]float64
}

func loadMoEGolden(t *testing.T) *moeGolden {
	t.Helper()
	b, err := os.ReadFile("testdata/moe_router.json")
	if err != nil {
		t.Fatal(err)
	}
	var g moeGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	// field names that differ from Go's case-insensitive match
	var raw struct {
		Losses []struct {
			ZCoeff float64 `json:"z_coeff"`
		}
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for i := range g.Losses {
		g.Losses[i].ZCoeff = raw.Losses[i].ZCoeff
	}
	return &g
}

func f32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

func scoreFn(t *testing.T, s string) ScoreFunction {
	switch s {
	case "softmax":
		return ScoreSoftmax
	case "sigmoid":
		return ScoreSigmoid
	case "sqrtsoftplus":
		return ScoreSqrtSoftplus
	}
	t.Fatalf("score function %q", s)
	return 0
}

func closeTo(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol*math.Max(1, math.Abs(want))
}

// TestRouteGolden compares the router's probabilities, routing map and
// logits gradient with Megatron's topk_routing_with_score_function and
// apply_router_token_dropping on the same logits.
func TestRouteGolden(t *testing.T) {
	g := loadMoEGolden(t)
	logits, dprobs := f32s(g.Logits), f32s(g.DProbs)
	for _, rc := range g.Routes {
		c := &RouterConfig{Experts: g.E, TopK: rc.TopK, Score: scoreFn(t, rc.Score), PreSoftmax: rc.PreSoftmax,
			NumGroups: rc.NumGroups, GroupTopK: rc.GroupTopK, ScalingFactor: rc.Scaling, ExpertBias: rc.ExpertBias,
			CapacityFactor: rc.CapacityFactor, DropByPosition: rc.DropPolicy == "position", PadToCapacity: rc.Pad,
			Batch: g.B, SeqLen: g.S}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", rc.Name, err)
		}
		r := Route(c, logits)
		dl := make([]float32, len(logits))
		RouteBackward(c, r, dprobs, 0, dl)
		for i := range rc.Probs {
			if r.Map[i] != (rc.Map[i] != 0) {
				t.Fatalf("%s: map[%d,%d] = %v, Megatron %v", rc.Name, i/g.E, i%g.E, r.Map[i], rc.Map[i])
			}
			if !closeTo(float64(r.Probs[i]), rc.Probs[i], 1e-6) {
				t.Fatalf("%s: probs[%d,%d] = %g, Megatron %g", rc.Name, i/g.E, i%g.E, r.Probs[i], rc.Probs[i])
			}
			if !closeTo(float64(dl[i]), rc.DLogits[i], 1e-5) {
				t.Fatalf("%s: dlogits[%d,%d] = %g, Megatron %g", rc.Name, i/g.E, i%g.E, dl[i], rc.DLogits[i])
			}
		}
	}
}

// TestRouterLossesGolden compares aux_loss, seq_aux_loss and the z-loss, and
// the logits gradient with MoEAuxLossAutoScaler's scale, with Megatron's.
func TestRouterLossesGolden(t *testing.T) {
	g := loadMoEGolden(t)
	logits, dprobs := f32s(g.Logits), f32s(g.DProbs)
	for _, lc := range g.Losses {
		c := &RouterConfig{Experts: g.E, TopK: lc.TopK, Score: scoreFn(t, lc.Score), Losses: true,
			ZLossCoeff: lc.ZCoeff, Batch: g.B, SeqLen: g.S}
		switch lc.Type {
		case "aux_loss":
			c.Balancing = []LoadBalancing{{Coeff: lc.Coeff}}
		case "seq_aux_loss":
			c.Balancing = []LoadBalancing{{Seq: true, Coeff: lc.Coeff}}
		}
		r := Route(c, logits)
		var aux float64
		for _, a := range r.Aux {
			aux += a
		}
		if !closeTo(aux, lc.Aux, 1e-6) || !closeTo(r.Z, lc.Z, 1e-6) {
			t.Fatalf("%s: aux %.9g z %.9g, Megatron %.9g %.9g", lc.Name, aux, r.Z, lc.Aux, lc.Z)
		}
		dl := make([]float32, len(logits))
		RouteBackward(c, r, dprobs, lc.Scale, dl)
		for i := range dl {
			if !closeTo(float64(dl[i]), lc.DLogits[i], 1e-5) {
				t.Fatalf("%s: dlogits[%d,%d] = %g, Megatron %g", lc.Name, i/g.E, i%g.E, dl[i], lc.DLogits[i])
			}
		}
	}
}

// TestGlobalAuxLossGolden: global_aux_loss's running mean of the counts over
// three micro-batches.
func TestGlobalAuxLossGolden(t *testing.T) {
	g := loadMoEGolden(t)
	ga := g.GlobalAux
	c := &RouterConfig{Experts: g.E, TopK: ga.TopK, Losses: true, Batch: g.B, SeqLen: g.S,
		Balancing: []LoadBalancing{{Global: true, Coeff: ga.Coeff}}}
	total := make([]float64, g.E)
	for i, mb := range ga.Microbatches {
		r := Route(c, f32s(mb.Logits))
		mean := make([]float64, g.E)
		for e, n := range r.AuxCounts(c) {
			total[e] += n
			mean[e] = total[e] / float64(i+1)
		}
		T := len(mb.Logits) / g.E
		r.SetGlobalCounts(c, 0, mean, float64(T))
		if !closeTo(r.Aux[0], mb.Loss, 1e-6) {
			t.Fatalf("micro-batch %d: global aux loss %.9g, Megatron %.9g", i, r.Aux[0], mb.Loss)
		}
		dl := make([]float32, len(mb.Logits))
		RouteBackward(c, r, make([]float32, len(mb.Logits)), 1, dl)
		for j := range dl {
			if !closeTo(float64(dl[j]), mb.DLogits[j], 1e-5) {
				t.Fatalf("micro-batch %d: dlogits[%d] = %g, Megatron %g", i, j, dl[j], mb.DLogits[j])
			}
		}
	}
}

// TestGlobalAuxLossDataParallelGolden: global_aux_loss over a reduce group
// of two ranks (Megatron's TP×DP×CP), three micro-batches: the counts summed
// over the ranks, their running mean, T·2 tokens; each rank's loss and
// logits gradient (at MoEAuxLossAutoScaler scale 0.5) against Megatron's
// get_tokens_per_expert_and_token_count and switch_load_balancing_loss_func.
func TestGlobalAuxLossDataParallelGolden(t *testing.T) {
	g := loadMoEGolden(t)
	ga := g.GlobalAuxDP
	if ga.Ranks != 2 || len(ga.Microbatches) != 3 {
		t.Fatalf("fixture: %d ranks, %d micro-batches", ga.Ranks, len(ga.Microbatches))
	}
	c := &RouterConfig{Experts: g.E, TopK: ga.TopK, Losses: true, Batch: g.B, SeqLen: g.S,
		Balancing: []LoadBalancing{{Global: true, Coeff: ga.Coeff}}}
	running := make([]float64, g.E)
	for i, mb := range ga.Microbatches {
		rs := make([]*RouteResult, ga.Ranks)
		for r, rank := range mb {
			rs[r] = Route(c, f32s(rank.Logits))
			for e, n := range rs[r].AuxCounts(c) {
				running[e] += n
			}
		}
		mean := make([]float64, g.E)
		for e := range mean {
			mean[e] = running[e] / float64(i+1)
		}
		for r, rank := range mb {
			T := len(rank.Logits) / g.E
			rs[r].SetGlobalCounts(c, 0, mean, float64(T*ga.Ranks))
			if !closeTo(rs[r].Aux[0], rank.Loss, 1e-6) {
				t.Fatalf("micro-batch %d rank %d: global aux loss %.9g, Megatron %.9g", i, r, rs[r].Aux[0], rank.Loss)
			}
			dl := make([]float32, len(rank.Logits))
			RouteBackward(c, rs[r], make([]float32, len(rank.Logits)), ga.Scale, dl)
			for j := range dl {
				if !closeTo(float64(dl[j]), rank.DLogits[j], 1e-5) {
					t.Fatalf("micro-batch %d rank %d: dlogits[%d] = %g, Megatron %g", i, r, j, dl[j], rank.DLogits[j])
				}
			}
		}
	}
}

func TestExpertBiasAndCapacityGolden(t *testing.T) {
	g := loadMoEGolden(t)
	eb := g.ExpertBias
	b := append([]float32(nil), eb.Bias...)
	UpdateExpertBias(b, eb.Counts, eb.Rate)
	for i := range b {
		if b[i] != eb.Updated[i] {
			t.Fatalf("expert bias %d: %g, Megatron %g", i, b[i], eb.Updated[i])
		}
	}
	for _, c := range g.Capacity {
		if got := Capacity(int(c[0]), int(c[1]), c[2]); got != int(c[3]) {
			t.Errorf("get_capacity(%v, %v, %v) = %d, Megatron %v", c[0], c[1], c[2], got, c[3])
		}
	}
}

// TestRouteBackwardFiniteDifference checks RouteBackward (probabilities and
// every loss) against central differences of Route in float64 arithmetic.
func TestRouteBackwardFiniteDifference(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	const E, B, S = 6, 2, 3
	T := B * S
	for _, c := range []RouterConfig{
		{Experts: E, TopK: 2},
		{Experts: E, TopK: 3, PreSoftmax: true, ScalingFactor: 1.5},
		{Experts: E, TopK: 2, Score: ScoreSigmoid, ExpertBias: []float32{0.1, 0, -0.1, 0.2, 0, 0}},
		{Experts: E, TopK: 3, Score: ScoreSqrtSoftplus},
		{Experts: E, TopK: 1, Score: ScoreSigmoid},
		{Experts: E, TopK: 2, Losses: true, ZLossCoeff: 0.1, Balancing: []LoadBalancing{{Coeff: 0.3}, {Seq: true, Coeff: 0.2}}},
		{Experts: E, TopK: 2, Score: ScoreSigmoid, Losses: true, ZLossCoeff: 0.05, Balancing: []LoadBalancing{{Coeff: 0.3}}},
	} {
		c.Batch, c.SeqLen = B, S
		logits := make([]float32, T*E)
		dp := make([]float32, T*E)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64())
			dp[i] = float32(rng.NormFloat64())
		}
		const scale = 0.7
		obj := func(l []float32) float64 {
			r := Route(&c, l)
			var s float64
			for i, p := range r.Probs {
				s += float64(p) * float64(dp[i])
			}
			for _, a := range r.Aux {
				s += scale * a
			}
			return s + scale*r.Z
		}
		r := Route(&c, logits)
		dl := make([]float32, T*E)
		RouteBackward(&c, r, dp, scale, dl)
		for i := range logits {
			const h = 1e-3
			lp := append([]float32(nil), logits...)
			lm := append([]float32(nil), logits...)
			lp[i] += h
			lm[i] -= h
			// the selection is fixed for small steps; float32 inputs limit accuracy
			fd := (obj(lp) - obj(lm)) / float64(lp[i]-lm[i])
			if math.Abs(fd-float64(dl[i])) > 2e-3*math.Max(1, math.Abs(fd)) {
				t.Fatalf("%+v: dlogits[%d] = %g, finite difference %g", c, i, dl[i], fd)
			}
		}
	}
}

// TestRouterExp: RouterExp is within 2 ulp of math.Exp (each is within
// one of e^x) over the router's range, and exact at the special cases.
// (amd64's math.Exp overflows to +Inf before 709.78, so the largest point
// checked is 709.)
func TestRouterExp(t *testing.T) {
	for _, x := range []float64{0, 1, -1, 1e-9, -1e-9, 0.5, -0.5, 10, -10, 700, -700, 709, -744, -745, -745.2, -800, 710, math.Inf(1), math.Inf(-1)} {
		got, want := RouterExp(x), math.Exp(x)
		if want == 0 || math.IsInf(want, 0) {
			if got != want && !(x < -744.4 && got < 5e-324*4) {
				t.Errorf("RouterExp(%v) = %v, math.Exp %v", x, got, want)
			}
			continue
		}
		if d := math.Abs(got-want) / want; d > 4.5e-16 {
			t.Errorf("RouterExp(%v) = %v, math.Exp %v (relative %g)", x, got, want, d)
		}
	}
	rng := rand.New(rand.NewSource(2))
	for range 100000 {
		x := (rng.Float64()*2 - 1) * 700
		got, want := RouterExp(x), math.Exp(x)
		if d := math.Abs(got-want) / want; d > 4.5e-16 {
			t.Fatalf("RouterExp(%v) = %v, math.Exp %v (relative %g)", x, got, want, d)
		}
	}
	if v := RouterExp(math.NaN()); !math.IsNaN(v) {
		t.Errorf("RouterExp(NaN) = %v", v)
	}
}

// TestRouterLog: RouterLog is within 1 ulp of math.Log (each is within
// one of log x) on the range the z-loss's sums reach (1 to the number of
// experts) and far beyond, subnormals included, and exact at the special
// cases.
func TestRouterLog(t *testing.T) {
	for _, c := range []struct{ x, want float64 }{
		{1, 0}, {math.Inf(1), math.Inf(1)}, {0, math.Inf(-1)}, {math.Copysign(0, -1), math.Inf(-1)},
	} {
		if got := RouterLog(c.x); got != c.want {
			t.Errorf("RouterLog(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	for _, x := range []float64{-1, math.Inf(-1), math.NaN()} {
		if got := RouterLog(x); !math.IsNaN(got) {
			t.Errorf("RouterLog(%v) = %v, want NaN", x, got)
		}
	}
	rng := rand.New(rand.NewSource(3))
	// subnormals against 2^-n's log (amd64's math.Log is -709.09 at 5e-324)
	for _, n := range []int{1074, 1050, 1023} {
		x := math.Ldexp(1, -n)
		if got, want := RouterLog(x), -float64(n)*math.Ln2; math.Abs(got-want) > 1e-13 {
			t.Errorf("RouterLog(2^-%d) = %v, want %v", n, got, want)
		}
	}
	xs := []float64{math.Sqrt2 / 2, math.Nextafter(math.Sqrt2/2, 0), math.Sqrt2, 2, 0.5, math.SmallestNonzeroFloat64 * (1 << 52), math.MaxFloat64, math.E}
	for range 200000 {
		xs = append(xs, 1+rng.Float64()*255, math.Exp((rng.Float64()*2-1)*700), math.Float64frombits(rng.Uint64()>>2|1<<52)) // normal
	}
	for _, x := range xs {
		got, want := RouterLog(x), math.Log(x)
		if ulp := math.Abs(math.Nextafter(want, math.Inf(1)) - want); math.Abs(got-want) > ulp {
			t.Fatalf("RouterLog(%v) = %v, math.Log %v", x, got, want)
		}
	}
}

// TestRouteFromSelection: the routing rebuilt from Route's choice of
// experts (as the CUDA router hands it over) has Route's map and token
// counts, for the golden configurations without capacity dropping; a
// selection with an expert out of range, a repeat or the wrong length is
// refused naming the token.
func TestRouteFromSelection(t *testing.T) {
	g := loadMoEGolden(t)
	logits := f32s(g.Logits)
	T := len(logits) / g.E
	n := 0
	for _, rc := range g.Routes {
		if rc.CapacityFactor > 0 {
			continue
		}
		n++
		c := &RouterConfig{Experts: g.E, TopK: rc.TopK, Score: scoreFn(t, rc.Score), PreSoftmax: rc.PreSoftmax,
			NumGroups: rc.NumGroups, GroupTopK: rc.GroupTopK, ScalingFactor: rc.Scaling, ExpertBias: rc.ExpertBias, Batch: g.B, SeqLen: g.S}
		r := Route(c, logits)
		var sel []int32
		for _, s := range r.sel {
			for _, e := range s {
				sel = append(sel, int32(e))
			}
		}
		got, err := RouteFromSelection(c, T, sel, nil, nil, 0)
		if err != nil {
			t.Fatalf("%s: %v", rc.Name, err)
		}
		for i := range r.Map {
			if got.Map[i] != r.Map[i] {
				t.Fatalf("%s: map[%d,%d] = %v, Route's %v", rc.Name, i/g.E, i%g.E, got.Map[i], r.Map[i])
			}
		}
		for e := range r.TokensPerExpert {
			if got.TokensPerExpert[e] != r.TokensPerExpert[e] {
				t.Fatalf("%s: expert %d has %v tokens, Route's %v", rc.Name, e, got.TokensPerExpert[e], r.TokensPerExpert[e])
			}
		}
	}
	if n == 0 {
		t.Fatal("no golden configuration without capacity dropping")
	}
	c := &RouterConfig{Experts: 4, TopK: 2}
	for _, bad := range []struct {
		sel  []int32
		want string
	}{
		{[]int32{0, 1, 2}, "3 chosen experts for 2 tokens of top-2: want 4"},
		{[]int32{0, 1, 3, 3}, "token 1: chosen experts [3 3]: want 2 distinct experts of 4"},
		{[]int32{0, 4, 1, 2}, "token 0: chosen experts [0 4]"},
		{[]int32{-1, 0, 1, 2}, "token 0: chosen experts [-1 0]"},
	} {
		if _, err := RouteFromSelection(c, 2, bad.sel, nil, nil, 0); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("RouteFromSelection(%v): %v, want an error with %q", bad.sel, err, bad.want)
		}
	}
	if _, err := RouteFromSelection(&RouterConfig{Experts: 4, TopK: 2, CapacityFactor: 1}, 1, []int32{0, 1}, nil, nil, 0); err == nil {
		t.Error("a selection under capacity dropping was accepted")
	}
	if _, err := RouteFromSelection(&RouterConfig{Experts: 4, TopK: 2, Losses: true, Balancing: []LoadBalancing{{Coeff: 1}}, Batch: 1, SeqLen: 1}, 1, []int32{0, 1}, []int32{0}, []float64{0, 0, 0, 0}, 0); err == nil || !strings.Contains(err.Error(), "from 1 aux-map entries") {
		t.Errorf("a short aux-loss map: %v", err)
	}
}

// TestRouteFromSelectionLosses: with the load-balancing losses, the routing
// rebuilt from Route's choice, its aux-loss map and each sequence's score
// sums (what the CUDA router reads back) has Route's counts (per expert
// and per sequence), coefficients bit for bit, hence LossGradients equal
// to RouteBackward64's sum (checked through the gradient's difference with
// and without a scale), and the loss values within float64 rounding —
// also after SetGlobalCounts and SetSeqCounts — for softmax and sigmoid.
func TestRouteFromSelectionLosses(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	const B, S, E, k = 3, 11, 8, 2
	T := B * S
	logits := make([]float32, T*E)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	for _, score := range []ScoreFunction{ScoreSoftmax, ScoreSigmoid} {
		c := &RouterConfig{Experts: E, TopK: k, Score: score, Losses: true, Batch: B, SeqLen: S, ZLossCoeff: 0.07,
			Balancing: []LoadBalancing{{Coeff: 0.01}, {Seq: true, Coeff: 0.02}, {Global: true, Coeff: 0.03}}}
		r := Route(c, logits)
		var sel, auxSel []int32
		sums := make([]float64, B*E)
		var zSum float64
		for tok := range T {
			lse := logSumExp(r.logits[tok*E : (tok+1)*E])
			zSum += float64(lse * lse)
			for _, e := range r.sel[tok] {
				sel = append(sel, int32(e))
			}
			for _, e := range topK(r.auxScores[tok*E:(tok+1)*E], k) {
				auxSel = append(auxSel, int32(e))
			}
			for e := range E {
				sums[tok/S*E+e] += r.auxScores[tok*E+e]
			}
		}
		got, err := RouteFromSelection(c, T, sel, auxSel, sums, zSum)
		if err != nil {
			t.Fatal(err)
		}
		if math.Float64bits(got.Z) != math.Float64bits(r.Z) || r.Z == 0 {
			t.Errorf("score %d: z-loss %v, Route's %v", score, got.Z, r.Z)
		}
		check := func(what string) {
			t.Helper()
			for i := range r.Aux {
				if d := math.Abs(got.Aux[i] - r.Aux[i]); d > 1e-13*math.Abs(r.Aux[i]) {
					t.Errorf("score %d %s: loss %d = %v, Route's %v", score, what, i, got.Aux[i], r.Aux[i])
				}
				for j := range r.auxCoef[i] {
					if math.Float64bits(got.auxCoef[i][j]) != math.Float64bits(r.auxCoef[i][j]) {
						t.Fatalf("score %d %s: loss %d coefficient %d = %v, Route's %v", score, what, i, j, got.auxCoef[i][j], r.auxCoef[i][j])
					}
				}
			}
		}
		check("rebuilt")
		if !slices.Equal(got.AuxCounts(c), r.AuxCounts(c)) || !slices.Equal(got.SeqAuxCounts(c), r.SeqAuxCounts(c)) {
			t.Errorf("score %d: counts %v %v, Route's %v %v", score, got.AuxCounts(c), got.SeqAuxCounts(c), r.AuxCounts(c), r.SeqAuxCounts(c))
		}
		mean := []float64{3, 1, 4, 1, 5, 9, 2, 6}
		got.SetGlobalCounts(c, 2, mean, 99)
		r.SetGlobalCounts(c, 2, mean, 99)
		counts := make([]float64, B*E)
		for i := range counts {
			counts[i] = float64(i % 5)
		}
		got.SetSeqCounts(c, 1, counts, 2*S)
		r.SetSeqCounts(c, 1, counts, 2*S)
		check("after SetGlobalCounts and SetSeqCounts")
		// RouteBackward64's loss part per token is LossGradients' row of
		// the token's sequence
		d := got.LossGradients(c, 0.5)
		for tok := range T {
			for e := range E {
				var want float64
				for i := range r.auxCoef {
					want += float64(0.5 * r.auxCoef[i][tok*E+e])
				}
				if math.Float64bits(d[tok/S*E+e]) != math.Float64bits(want) {
					t.Fatalf("score %d: loss gradient of token %d expert %d = %v, RouteBackward64's %v", score, tok, e, d[tok/S*E+e], want)
				}
			}
		}
	}
}

// TestRouteFromCounts: the routing rebuilt from the token counts and the
// aux-loss map's per-sequence counts (what the CUDA router reads back when
// it permutes on the device) has Route's counts, coefficients and z-loss
// bit for bit and its loss values within float64 rounding; SetSelection
// then gives it Route's map. Counts that do not add up are refused naming
// the expert or sequence.
func TestRouteFromCounts(t *testing.T) {
	rng := rand.New(rand.NewSource(6))
	const B, S, E, k = 3, 11, 8, 2
	T := B * S
	logits := make([]float32, T*E)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	for _, score := range []ScoreFunction{ScoreSoftmax, ScoreSigmoid} {
		c := &RouterConfig{Experts: E, TopK: k, Score: score, Losses: true, Batch: B, SeqLen: S, ZLossCoeff: 0.07,
			Balancing: []LoadBalancing{{Coeff: 0.01}, {Seq: true, Coeff: 0.02}, {Global: true, Coeff: 0.03}}}
		r := Route(c, logits)
		counts, seqAux, sel := make([]int32, E), make([]int32, B*E), []int32(nil)
		sums := make([]float64, B*E)
		var zSum float64
		for e, n := range r.TokensPerExpert {
			counts[e] = int32(n)
		}
		for i, n := range r.SeqAuxCounts(c) {
			seqAux[i] = int32(n)
		}
		for tok := range T {
			lse := logSumExp(r.logits[tok*E : (tok+1)*E])
			zSum += float64(lse * lse)
			for e := range E {
				sums[tok/S*E+e] += r.auxScores[tok*E+e]
			}
			for _, e := range r.sel[tok] {
				sel = append(sel, int32(e))
			}
		}
		got, err := RouteFromCounts(c, T, counts, seqAux, sums, zSum)
		if err != nil {
			t.Fatal(err)
		}
		if math.Float64bits(got.Z) != math.Float64bits(r.Z) || !slices.Equal(got.TokensPerExpert, r.TokensPerExpert) ||
			!slices.Equal(got.AuxCounts(c), r.AuxCounts(c)) || !slices.Equal(got.SeqAuxCounts(c), r.SeqAuxCounts(c)) {
			t.Errorf("score %d: z %v, counts %v %v %v; Route's %v, %v %v %v", score, got.Z, got.TokensPerExpert, got.AuxCounts(c), got.SeqAuxCounts(c),
				r.Z, r.TokensPerExpert, r.AuxCounts(c), r.SeqAuxCounts(c))
		}
		for i := range r.Aux {
			if d := math.Abs(got.Aux[i] - r.Aux[i]); d > 1e-13*math.Abs(r.Aux[i]) {
				t.Errorf("score %d: loss %d = %v, Route's %v", score, i, got.Aux[i], r.Aux[i])
			}
			for j := range r.auxCoef[i] {
				if math.Float64bits(got.auxCoef[i][j]) != math.Float64bits(r.auxCoef[i][j]) {
					t.Fatalf("score %d: loss %d coefficient %d = %v, Route's %v", score, i, j, got.auxCoef[i][j], r.auxCoef[i][j])
				}
			}
		}
		if got.Map != nil {
			t.Fatal("a routing from counts has a map before SetSelection")
		}
		if err := got.SetSelection(c, T, sel); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Map, r.Map) {
			t.Errorf("score %d: the map after SetSelection differs from Route's", score)
		}
		bad := append([]int32(nil), sel...)
		bad[0] = (bad[0] + 1) % E
		if bad[0] == bad[1] {
			bad[0] = (bad[0] + 1) % E
		}
		if err := got.SetSelection(c, T, bad); err == nil || !strings.Contains(err.Error(), "counted") {
			t.Errorf("score %d: a selection that disagrees with the counts: %v", score, err)
		}
	}
	c := &RouterConfig{Experts: 4, TopK: 2}
	for _, bad := range []struct {
		counts []int32
		want   string
	}{
		{[]int32{1, 1, 1}, "token counts of 3 experts: want 4"},
		{[]int32{2, 2, 0, -1}, "expert 3 has -1 of 2 tokens"},
		{[]int32{3, 1, 0, 0}, "expert 0 has 3 of 2 tokens"},
		{[]int32{1, 1, 1, 0}, "sum to 3: want 2 tokens × top-2 = 4"},
	} {
		if _, err := RouteFromCounts(c, 2, bad.counts, nil, nil, 0); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("RouteFromCounts(%v): %v, want an error with %q", bad.counts, err, bad.want)
		}
	}
	lc := &RouterConfig{Experts: 2, TopK: 1, Losses: true, Balancing: []LoadBalancing{{Seq: true, Coeff: 1}}, Batch: 2, SeqLen: 1}
	for _, bad := range []struct {
		seq  []int32
		want string
	}{
		{[]int32{1, 0, 1}, "from 3 aux-map counts and 4 sums: want 4 each"},
		{[]int32{1, 0, 2, -1}, "sequence 1: expert 0 has 2 aux-loss map entries of 1 tokens"},
		{[]int32{1, 0, 0, 0}, "sequence 1: its aux-loss map counts sum to 0: want 1 tokens × top-1 = 1"},
	} {
		if _, err := RouteFromCounts(lc, 2, []int32{1, 1}, bad.seq, make([]float64, 4), 0); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("RouteFromCounts(aux %v): %v, want an error with %q", bad.seq, err, bad.want)
		}
	}
	if _, err := RouteFromCounts(&RouterConfig{Experts: 4, TopK: 2, CapacityFactor: 1}, 1, []int32{1, 1, 0, 0}, nil, nil, 0); err == nil {
		t.Error("counts under capacity dropping were accepted")
	}
}
