package cpu

import (
	"fmt"
	"math"
	"sort"
)

// The Mixture-of-Experts router of Megatron core (TopKRouter, moe_utils.py):
// top-k selection under a score function, group-limited top-k, the expert
// bias of aux-loss-free balancing, capacity dropping, and the load-balancing
// and z losses with their gradients. The arrays are small (tokens × experts)
// and the arithmetic runs in float64 (results rounded to float32 once), so
// the float32 of Megatron's fp32 router and the float64 of its fp64 router
// both compare to this within their own rounding.
//
// Token order: rows are gotron's (batch b, position s) order, row b·S+s;
// Megatron routes [S, B] sequence-major, token s·B+b. The order matters only
// where Megatron breaks ties by token index (the "position" drop policy, and
// equal probabilities under "probs"): Route ranks ties by Megatron's index,
// lowest first, as torch.topk does on the GPU (the CPU keeps the highest;
// Megatron's own tests and docs assume the GPU rule).

// ScoreFunction is --moe-router-score-function.
type ScoreFunction int

// The score functions.
const (
	ScoreSoftmax ScoreFunction = iota
	ScoreSigmoid
	ScoreSqrtSoftplus
)

// LoadBalancing is one --moe-router-load-balancing-type with its coefficient.
type LoadBalancing struct {
	Seq, Global bool    // seq_aux_loss, global_aux_loss; neither: aux_loss
	Coeff       float64 // --moe-aux-loss-coeff
}

// RouterConfig is one TopKRouter.
type RouterConfig struct {
	Experts, TopK int
	Score         ScoreFunction
	PreSoftmax    bool    // --moe-router-pre-softmax (softmax only)
	NumGroups     int     // --moe-router-num-groups (0: no group limit)
	GroupTopK     int     // --moe-router-group-topk
	ScalingFactor float64 // --moe-router-topk-scaling-factor (0: none)
	// ExpertBias (E), nil without --moe-router-enable-expert-bias: added to
	// the scores for the selection only.
	ExpertBias []float32
	// CapacityFactor > 0 drops tokens beyond each expert's capacity
	// ceil(T·k/E·cf) by DropByPosition (else by probability); PadToCapacity
	// fills every expert to exactly its capacity.
	CapacityFactor float64
	DropByPosition bool
	PadToCapacity  bool
	// Losses: the load-balancing types with their coefficients, and the
	// z-loss coefficient (0: none). Computed only when Losses is true
	// (training with gradients, as Megatron).
	Losses        bool
	Balancing     []LoadBalancing
	ZLossCoeff    float64
	Batch, SeqLen int // B sequences of S tokens: the rows are B·S
}

// RouteResult is the routing of one micro-batch.
type RouteResult struct {
	Probs []float32 // (T, E), zero outside the routed experts
	Map   []bool    // (T, E) routing map after dropping
	// Aux holds each Balancing entry's loss (coefficient included) and Z the
	// z-loss (coefficient included), for logging and the backward.
	Aux []float64
	Z   float64
	// TokensPerExpert counts Map's columns (the expert-bias counts).
	TokensPerExpert []float64
	// saved for the backward
	logits    []float64 // in the router dtype (float64 with Route64)
	rlogits   []float64 // rounded to float32: what the score functions see
	sel       [][]int   // per token, the selected experts (before dropping)
	auxScores []float64
	auxCoef   [][]float64 // per Balancing entry, dL/dscore (T, E)
	// the aux-loss map's counts per expert and per sequence and expert
	// (nil unless Batch·SeqLen is the tokens), and, for a routing made on
	// the GPU (auxScores nil), each sequence's sums of the aux scores per
	// expert (Batch, E)
	auxCounts, seqCounts, auxSums []float64
}

// Capacity is Megatron's get_capacity: ceil(tokens/experts·factor).
func Capacity(tokens, experts int, factor float64) int {
	return int(math.Ceil(float64(tokens) / float64(experts) * factor))
}

// megatronIndex is row's token index in Megatron's [S, B] order.
func (c *RouterConfig) megatronIndex(row int) int {
	if c.SeqLen <= 0 || c.Batch <= 0 {
		return row
	}
	b, s := row/c.SeqLen, row%c.SeqLen
	return s*c.Batch + b
}

// topK returns the indices of the k largest of v (ties: lowest index
// first), in descending order.
func topK(v []float64, k int) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] > v[idx[b]] })
	return idx[:k]
}

// selectExperts is _compute_topk: plain or group-limited top-k of scores.
func (c *RouterConfig) selectExperts(scores []float64) []int {
	if c.GroupTopK <= 0 {
		return topK(scores, c.TopK)
	}
	g, per := c.NumGroups, c.Experts/c.NumGroups
	gs := make([]float64, g)
	for j := range g {
		for _, i := range topK(scores[j*per:(j+1)*per], c.TopK/c.GroupTopK) {
			gs[j] += scores[j*per+i]
		}
	}
	masked := make([]float64, len(scores))
	for i := range masked {
		masked[i] = math.Inf(-1)
	}
	for _, j := range topK(gs, c.GroupTopK) {
		copy(masked[j*per:(j+1)*per], scores[j*per:(j+1)*per])
	}
	return topK(masked, c.TopK)
}

func softmax64(dst, x []float64) {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, v)
	}
	var s float64
	for i, v := range x {
		dst[i] = RouterExp(v - m)
		s += dst[i]
	}
	for i := range dst {
		dst[i] /= s
	}
}

func score64(f ScoreFunction, x float64) float64 {
	if f == ScoreSigmoid {
		return 1 / (1 + RouterExp(-x))
	}
	return math.Sqrt(softplus64(x))
}

// softplus64 is torch's softplus (beta 1, threshold 20).
func softplus64(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(RouterExp(x))
}

// dscore64 is d score/dx.
func dscore64(f ScoreFunction, x float64) float64 {
	sg := 1 / (1 + RouterExp(-x))
	if f == ScoreSigmoid {
		return sg * (1 - sg)
	}
	if x > 20 {
		return 1 / (2 * math.Sqrt(x))
	}
	return sg / (2 * math.Sqrt(softplus64(x)))
}

// Validate checks the settings Route relies on.
func (c *RouterConfig) Validate() error {
	switch {
	case c.Experts <= 0:
		return fmt.Errorf("num experts %d: want > 0", c.Experts)
	case c.TopK <= 0 || c.TopK > c.Experts:
		return fmt.Errorf("top-k %d: want 1..%d (the number of experts)", c.TopK, c.Experts)
	case c.GroupTopK > 0 && (c.NumGroups <= 0 || c.Experts%c.NumGroups != 0 || c.GroupTopK > c.NumGroups || c.TopK%c.GroupTopK != 0 || c.TopK/c.GroupTopK > c.Experts/c.NumGroups):
		return fmt.Errorf("group-limited top-k: %d groups of %d experts, %d groups chosen, top-%d: want groups dividing the experts, group top-k <= groups, dividing top-k", c.NumGroups, c.Experts, c.GroupTopK, c.TopK)
	case c.ExpertBias != nil && (len(c.ExpertBias) != c.Experts || c.Score == ScoreSoftmax):
		return fmt.Errorf("expert bias of %d entries with score function %d: want %d entries and sigmoid or sqrtsoftplus", len(c.ExpertBias), c.Score, c.Experts)
	}
	return nil
}

// Route is TopKRouter.routing on logits (T, E): the probabilities and map
// after dropping, each loss's value, and what RouteBackward needs.
func Route(c *RouterConfig, logits []float32) *RouteResult {
	l64 := make([]float64, len(logits))
	for i, v := range logits {
		l64[i] = float64(v)
	}
	return Route64(c, l64)
}

// Route64 is Route on float64 logits (Megatron's --moe-router-dtype fp64):
// as Megatron, the post-softmax top-k and the z-loss see them in float64,
// the score functions (which Megatron runs in float32) see them rounded to
// float32.
func Route64(c *RouterConfig, logits []float64) *RouteResult {
	E, k := c.Experts, c.TopK
	T := len(logits) / E
	r := &RouteResult{Probs: make([]float32, T*E), Map: make([]bool, T*E), logits: logits, rlogits: make([]float64, T*E), sel: make([][]int, T)}
	for i, v := range logits {
		r.rlogits[i] = float64(float32(v))
	}
	probs := make([]float64, T*E)
	scores := make([]float64, E)
	for t := range T {
		raw, l := r.logits[t*E:(t+1)*E], r.rlogits[t*E:(t+1)*E]
		var sel []int
		var p []float64
		switch {
		case c.Score == ScoreSoftmax && c.PreSoftmax:
			softmax64(scores, l)
			sel = c.selectExperts(scores)
			p = make([]float64, k)
			for j, e := range sel {
				p[j] = scores[e]
			}
		case c.Score == ScoreSoftmax:
			sel = c.selectExperts(raw) // top-k on the router-dtype logits
			sl := make([]float64, k)
			for j, e := range sel {
				sl[j] = l[e]
			}
			p = make([]float64, k)
			softmax64(p, sl)
		default:
			for e := range E {
				scores[e] = score64(c.Score, l[e])
			}
			routing := scores
			if c.ExpertBias != nil {
				routing = make([]float64, E)
				for e := range E {
					routing[e] = scores[e] + float64(c.ExpertBias[e])
				}
			}
			sel = c.selectExperts(routing)
			p = make([]float64, k)
			var s float64
			for j, e := range sel {
				p[j] = scores[e]
				s += p[j]
			}
			if k > 1 {
				for j := range p {
					p[j] /= s + 1e-20
				}
			}
		}
		if c.ScalingFactor != 0 {
			for j := range p {
				p[j] *= c.ScalingFactor
			}
		}
		r.sel[t] = sel
		for j, e := range sel {
			probs[t*E+e] = p[j]
			r.Map[t*E+e] = true
		}
	}
	if c.CapacityFactor > 0 {
		c.drop(T, probs, r.Map)
	}
	r.TokensPerExpert = make([]float64, E)
	for i, on := range r.Map {
		if on {
			r.TokensPerExpert[i%E]++
		} else {
			probs[i] = 0
		}
		r.Probs[i] = float32(probs[i])
	}
	if c.Losses {
		c.losses(T, r)
	}
	return r
}

// RouteFromSelection is the routing of T tokens whose experts were chosen
// elsewhere (the CUDA router, bit for bit Route64's choice): sel (T, k),
// each token's experts in Route's order. The configuration has no capacity
// dropping (what the device routes), so the map is the selection. With
// losses, auxSel (T, k) is the aux-loss map (the top-k of the all-expert
// aux scores), auxSums (Batch, E) each sequence's sums of those scores per
// expert and, with the z-loss, zSum the sum over the tokens, in order, of
// each one's log-sum-exp squared (losses's z before its mean: the z-loss
// is then Route's bit for bit); the coefficients are Route's and the
// load-balancing loss values equal up to float64 rounding (auxDot). Probs
// is nil (the probabilities stay on the device), and the result serves no
// RouteBackward (the device's backward takes its place: LossGradients).
func RouteFromSelection(c *RouterConfig, T int, sel, auxSel []int32, auxSums []float64, zSum float64) (*RouteResult, error) {
	E, k := c.Experts, c.TopK
	if c.CapacityFactor > 0 {
		return nil, fmt.Errorf("a selection made elsewhere cannot be dropped by capacity")
	}
	if len(sel) != T*k {
		return nil, fmt.Errorf("%d chosen experts for %d tokens of top-%d: want %d", len(sel), T, k, T*k)
	}
	mapOf := func(what string, sel []int32) ([]bool, error) {
		m := make([]bool, T*E)
		for t := range T {
			for _, e := range sel[t*k : (t+1)*k] {
				if e < 0 || int(e) >= E || m[t*E+int(e)] {
					return nil, fmt.Errorf("token %d: %s %v: want %d distinct experts of %d", t, what, sel[t*k:(t+1)*k], k, E)
				}
				m[t*E+int(e)] = true
			}
		}
		return m, nil
	}
	m, err := mapOf("chosen experts", sel)
	if err != nil {
		return nil, err
	}
	r := &RouteResult{Map: m, TokensPerExpert: make([]float64, E), sel: make([][]int, T)}
	for t := range T {
		r.sel[t] = make([]int, k)
		for j, e := range sel[t*k : (t+1)*k] {
			r.TokensPerExpert[e]++
			r.sel[t][j] = int(e)
		}
	}
	if !c.Losses {
		return r, nil
	}
	if c.Batch <= 0 || c.SeqLen <= 0 || c.Batch*c.SeqLen != T || len(auxSel) != T*k || len(auxSums) != c.Batch*E {
		return nil, fmt.Errorf("losses over %d tokens (%d sequences of %d) from %d aux-map entries and %d sums: want %d and %d", T, c.Batch, c.SeqLen, len(auxSel), len(auxSums), T*k, c.Batch*E)
	}
	amap, err := mapOf("aux-loss experts", auxSel)
	if err != nil {
		return nil, err
	}
	r.auxSums = auxSums
	c.balancing(T, r, amap)
	if c.ZLossCoeff != 0 {
		r.Z = zSum / float64(T) * c.ZLossCoeff
	}
	return r, nil
}

// RouteFromCounts is the routing of T tokens routed and permuted
// elsewhere (the CUDA router, which keeps the map and the permutation on
// the device): counts (E) the tokens of each expert and, with losses,
// seqAux (Batch, E) the aux-loss map's entries per sequence and expert,
// auxSums and zSum as RouteFromSelection's. No capacity dropping, so the
// counts sum to T·k and each sequence's aux counts to SeqLen·k. The map is
// nil until SetSelection; the loss coefficients, the counts and the z-loss
// are Route's bit for bit (integer counts), the load-balancing losses'
// values within float64 rounding (auxDot).
func RouteFromCounts(c *RouterConfig, T int, counts, seqAux []int32, auxSums []float64, zSum float64) (*RouteResult, error) {
	E, k := c.Experts, c.TopK
	if c.CapacityFactor > 0 {
		return nil, fmt.Errorf("a routing made elsewhere cannot be dropped by capacity")
	}
	if len(counts) != E {
		return nil, fmt.Errorf("token counts of %d experts: want %d", len(counts), E)
	}
	r := &RouteResult{TokensPerExpert: make([]float64, E)}
	total := 0
	for e, n := range counts {
		if n < 0 || int(n) > T {
			return nil, fmt.Errorf("expert %d has %d of %d tokens", e, n, T)
		}
		total += int(n)
		r.TokensPerExpert[e] = float64(n)
	}
	if total != T*k {
		return nil, fmt.Errorf("the experts' token counts sum to %d: want %d tokens × top-%d = %d", total, T, k, T*k)
	}
	if !c.Losses {
		return r, nil
	}
	B, S := c.Batch, c.SeqLen
	if B <= 0 || S <= 0 || B*S != T || len(seqAux) != B*E || len(auxSums) != B*E {
		return nil, fmt.Errorf("losses over %d tokens (%d sequences of %d) from %d aux-map counts and %d sums: want %d each", T, B, S, len(seqAux), len(auxSums), B*E)
	}
	n, seq := make([]float64, E), make([]float64, B*E)
	for b := range B {
		row := 0
		for e, v := range seqAux[b*E : (b+1)*E] {
			if v < 0 || int(v) > S {
				return nil, fmt.Errorf("sequence %d: expert %d has %d aux-loss map entries of %d tokens", b, e, v, S)
			}
			row += int(v)
			n[e] += float64(v)
			seq[b*E+e] = float64(v)
		}
		if row != S*k {
			return nil, fmt.Errorf("sequence %d: its aux-loss map counts sum to %d: want %d tokens × top-%d = %d", b, row, S, k, S*k)
		}
	}
	r.auxSums = auxSums
	c.balancingCounts(T, r, n, seq)
	if c.ZLossCoeff != 0 {
		r.Z = zSum / float64(T) * c.ZLossCoeff
	}
	return r, nil
}

// SetSelection gives a routing from RouteFromCounts its map: sel (T, k)
// each token's experts, which must agree with the counts.
func (r *RouteResult) SetSelection(c *RouterConfig, T int, sel []int32) error {
	got, err := RouteFromSelection(&RouterConfig{Experts: c.Experts, TopK: c.TopK}, T, sel, nil, nil, 0)
	if err != nil {
		return err
	}
	for e, n := range got.TokensPerExpert {
		if n != r.TokensPerExpert[e] {
			return fmt.Errorf("expert %d: %v tokens in the selection, %v counted", e, n, r.TokensPerExpert[e])
		}
	}
	r.Map, r.sel = got.Map, got.sel
	return nil
}

// LossGradients is the gradient of the losses through the aux scores,
// auxScale times each loss's coefficients summed over the losses in
// RouteBackward64's order, per sequence and expert (Batch, E): the
// coefficients are constant over a sequence's tokens. Nil without losses
// or with a zero scale (RouteBackward64 adds nothing then).
func (r *RouteResult) LossGradients(c *RouterConfig, auxScale float64) []float64 {
	if !c.Losses || auxScale == 0 || len(r.auxCoef) == 0 {
		return nil
	}
	E, S := c.Experts, c.SeqLen
	d := make([]float64, c.Batch*E)
	for b := range c.Batch {
		for i := range r.auxCoef {
			for e := range E {
				d[b*E+e] += float64(auxScale * r.auxCoef[i][b*S*E+e])
			}
		}
	}
	return d
}

// drop is apply_router_token_dropping: per expert, keep the capacity's
// highest probabilities (or the earliest routed tokens), ties by Megatron's
// token index; with PadToCapacity the kept set is the map.
func (c *RouterConfig) drop(T int, probs []float64, m []bool) {
	E := c.Experts
	capa := Capacity(T*c.TopK, E, c.CapacityFactor)
	if capa > T {
		return
	}
	order := make([]int, T)
	keep := make([]bool, T)
	for e := range E {
		for i := range order {
			order[i] = i
		}
		val := func(t int) float64 {
			if c.DropByPosition {
				if m[t*E+e] {
					return 1
				}
				return 0
			}
			return probs[t*E+e]
		}
		sort.Slice(order, func(a, b int) bool {
			va, vb := val(order[a]), val(order[b])
			if va != vb {
				return va > vb
			}
			return c.megatronIndex(order[a]) < c.megatronIndex(order[b])
		})
		clear(keep)
		for _, t := range order[:capa] {
			keep[t] = true
		}
		for t := range T {
			if c.PadToCapacity {
				m[t*E+e] = keep[t]
			} else {
				m[t*E+e] = m[t*E+e] && keep[t]
			}
		}
	}
}

// losses computes the load-balancing losses on the all-expert scores
// (compute_routing_scores_for_aux_loss: no bias, no group limit, no
// dropping) and the z-loss, for one rank whose reduction groups are itself.
func (c *RouterConfig) losses(T int, r *RouteResult) {
	E, k := c.Experts, c.TopK
	sc := make([]float64, T*E)
	amap := make([]bool, T*E)
	for t := range T {
		row := sc[t*E : (t+1)*E]
		l := r.rlogits[t*E : (t+1)*E]
		if c.Score == ScoreSoftmax {
			softmax64(row, l)
		} else {
			var s float64
			for e := range E {
				row[e] = score64(c.Score, l[e])
				s += row[e]
			}
			for e := range E {
				row[e] /= s + 1e-20
			}
		}
		for _, e := range topK(row, k) {
			amap[t*E+e] = true
		}
	}
	r.auxScores = sc
	c.balancing(T, r, amap)
	if c.ZLossCoeff != 0 {
		var z float64
		for t := range T {
			lse := logSumExp(r.logits[t*E : (t+1)*E])
			z += float64(lse * lse)
		}
		r.Z = z / float64(T) * c.ZLossCoeff
	}
}

// balancing computes each load-balancing loss's coefficients (T, E) from
// the aux-loss map amap (the top-k of the all-expert scores) and its value
// (auxDot): from its counts, per expert and per sequence.
func (c *RouterConfig) balancing(T int, r *RouteResult, amap []bool) {
	E, B, S := c.Experts, c.Batch, c.SeqLen
	n := make([]float64, E)
	for j, on := range amap {
		if on {
			n[j%E]++
		}
	}
	var seq []float64
	if B > 0 && S > 0 && B*S <= T {
		seq = make([]float64, B*E)
		for j, on := range amap[:B*S*E] {
			if on {
				seq[j/E/S*E+j%E]++
			}
		}
	}
	c.balancingCounts(T, r, n, seq)
}

// balancingCounts is balancing from the aux-loss map's counts per expert
// n (E) and per sequence and expert seq (Batch, E; nil when the rows are
// not Batch sequences of SeqLen tokens, which seq_aux_loss needs).
func (c *RouterConfig) balancingCounts(T int, r *RouteResult, n, seq []float64) {
	E, k := c.Experts, c.TopK
	r.Aux = make([]float64, len(c.Balancing))
	r.auxCoef = make([][]float64, len(c.Balancing))
	for i, lb := range c.Balancing {
		coef := make([]float64, T*E)
		switch {
		case lb.Seq:
			B, S := c.Batch, c.SeqLen
			if seq == nil {
				panic(fmt.Sprintf("cpu: seq_aux_loss over %d tokens of %d sequences of %d", T, B, S))
			}
			f := float64(E) * lb.Coeff / (float64(k) * float64(S) * float64(S)) / float64(B)
			for b := range B {
				for s := range S {
					for e := range E {
						coef[(b*S+s)*E+e] = f * seq[b*E+e]
					}
				}
			}
		default: // aux_loss; global_aux_loss on one rank and the first micro-batch alike
			f := float64(E) * lb.Coeff / (float64(k) * float64(T) * float64(T))
			for j := range coef {
				coef[j] = f * n[j%E]
			}
		}
		r.Aux[i], r.auxCoef[i] = r.auxDot(c, coef), coef
	}
	r.auxCounts = append([]float64(nil), n...)
	r.seqCounts = nil
	if c.Batch > 0 && c.SeqLen > 0 && c.Batch*c.SeqLen == T {
		r.seqCounts = append([]float64(nil), seq...)
	}
}

// auxDot is Σ coef·(aux scores): over the host's scores in (token, expert)
// order, or, for a routing made on the GPU, over its sums of each
// sequence's scores per expert (coef is constant over a sequence's tokens:
// each loss's counts are per sequence or per micro-batch), so the value
// differs from the host's in float64 rounding only. It is logged, not
// differentiated: the gradient takes the coefficients.
func (r *RouteResult) auxDot(c *RouterConfig, coef []float64) float64 {
	var loss float64
	if r.auxScores != nil {
		for j, v := range coef {
			loss += v * r.auxScores[j]
		}
		return loss
	}
	E, S := c.Experts, c.SeqLen
	for b := range len(r.auxSums) / E {
		for e := range E {
			loss += coef[b*S*E+e] * r.auxSums[b*E+e]
		}
	}
	return loss
}

// SetGlobalCounts replaces the counts of global_aux_loss entry i by the
// running mean over micro-batches (Megatron's global_tokens_per_expert /
// ga_steps) with T_tot tokens, recomputing its loss.
func (r *RouteResult) SetGlobalCounts(c *RouterConfig, i int, mean []float64, tTot float64) {
	E := c.Experts
	f := float64(E) * c.Balancing[i].Coeff / (float64(c.TopK) * tTot * tTot)
	for j := range r.auxCoef[i] {
		r.auxCoef[i][j] = f * mean[j%E]
	}
	r.Aux[i] = r.auxDot(c, r.auxCoef[i])
}

// SeqAuxCounts returns the aux-loss map's counts per sequence and expert
// (B, E): seq_aux_loss's counts, for their sum over the ranks holding other
// parts of the same sequences.
func (r *RouteResult) SeqAuxCounts(c *RouterConfig) []float64 {
	return append([]float64(nil), r.seqCounts...)
}

// SetSeqCounts replaces the counts of seq_aux_loss entry i by counts (B, E)
// per sequence of seqLen tokens (summed over the ranks that hold parts of
// the sequences), recomputing its loss on this rank's rows.
func (r *RouteResult) SetSeqCounts(c *RouterConfig, i int, counts []float64, seqLen int) {
	E, B, S := c.Experts, c.Batch, c.SeqLen
	f := float64(E) * c.Balancing[i].Coeff / (float64(c.TopK) * float64(seqLen) * float64(seqLen)) / float64(B)
	for b := range B {
		for s := range S {
			for e := range E {
				j := (b*S+s)*E + e
				r.auxCoef[i][j] = f * counts[b*E+e]
			}
		}
	}
	r.Aux[i] = r.auxDot(c, r.auxCoef[i])
}

// AuxCounts returns the aux-loss map's per-expert counts (the top-k of the
// all-expert scores), for global_aux_loss's running counts.
func (r *RouteResult) AuxCounts(c *RouterConfig) []float64 {
	return append([]float64(nil), r.auxCounts...)
}

// logSumExp is log Σ e^x, the z-loss's: the maximum plus the log of the
// sum of e^(x − max) in order, by RouterExp and RouterLog (the CUDA
// router's moe_lse computes the same bits).
func logSumExp(x []float64) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, v)
	}
	var s float64
	for _, v := range x {
		s += RouterExp(v - m)
	}
	return m + RouterLog(s)
}

// RouteBackward writes dlogits (T, E) for the probabilities' gradient
// dprobs (T, E), plus auxScale times the gradients of the losses (Megatron's
// MoEAuxLossAutoScaler: each attached loss's gradient is the class-wide
// scale).
func RouteBackward(c *RouterConfig, r *RouteResult, dprobs []float32, auxScale float64, dlogits []float32) {
	d := make([]float64, len(dlogits))
	RouteBackward64(c, r, dprobs, auxScale, d)
	for i, v := range d {
		dlogits[i] = float32(v)
	}
}

// RouteBackward64 is RouteBackward with float64 logits gradients.
func RouteBackward64(c *RouterConfig, r *RouteResult, dprobs []float32, auxScale float64, dlogits []float64) {
	E, k := c.Experts, c.TopK
	T := len(r.logits) / E
	sf := c.ScalingFactor
	if sf == 0 {
		sf = 1
	}
	d := make([]float64, E)
	tmp := make([]float64, E)
	for t := range T {
		raw, l := r.logits[t*E:(t+1)*E], r.rlogits[t*E:(t+1)*E]
		clear(d)
		sel := r.sel[t]
		dp := make([]float64, k) // gradient of the selected (scaled) probs
		for j, e := range sel {
			if r.Map[t*E+e] { // dropped entries were zeroed
				dp[j] = float64(dprobs[t*E+e]) * sf
			}
		}
		switch {
		case c.Score == ScoreSoftmax && c.PreSoftmax:
			softmax64(tmp, l)
			full := make([]float64, E)
			for j, e := range sel {
				full[e] = dp[j]
			}
			softmaxBack(d, tmp, full)
		case c.Score == ScoreSoftmax:
			sl := make([]float64, k)
			for j, e := range sel {
				sl[j] = l[e]
			}
			p := make([]float64, k)
			softmax64(p, sl)
			dl := make([]float64, k)
			softmaxBack(dl, p, dp)
			for j, e := range sel {
				d[e] += dl[j]
			}
		default:
			s := make([]float64, k)
			var sum float64
			for j, e := range sel {
				s[j] = score64(c.Score, l[e])
				sum += s[j]
			}
			ds := make([]float64, k)
			if k > 1 {
				den := sum + 1e-20
				var dot float64
				for j := range s {
					dot += float64(dp[j] * s[j])
				}
				for j := range s {
					ds[j] = dp[j]/den - dot/(den*den)
				}
			} else {
				copy(ds, dp)
			}
			for j, e := range sel {
				d[e] += float64(ds[j] * dscore64(c.Score, l[e]))
			}
		}
		if c.Losses && auxScale != 0 {
			dsc := make([]float64, E)
			for i := range r.auxCoef {
				for e := range E {
					dsc[e] += float64(auxScale * r.auxCoef[i][t*E+e])
				}
			}
			row := r.auxScores[t*E : (t+1)*E]
			if c.Score == ScoreSoftmax {
				softmaxBack(tmp, row, dsc)
				for e := range E {
					d[e] += tmp[e]
				}
			} else {
				// q = s/(Σs+ε) over all E
				var sum, dot float64
				for e := range E {
					tmp[e] = score64(c.Score, l[e])
					sum += tmp[e]
				}
				den := sum + 1e-20
				for e := range E {
					dot += float64(dsc[e] * tmp[e])
				}
				for e := range E {
					d[e] += float64((dsc[e]/den - dot/(den*den)) * dscore64(c.Score, l[e]))
				}
			}
			if c.ZLossCoeff != 0 {
				lse := logSumExp(raw) // the z-loss is on the router-dtype logits
				softmax64(tmp, raw)
				f := auxScale * c.ZLossCoeff * 2 * lse / float64(T)
				for e := range E {
					d[e] += f * tmp[e]
				}
			}
		}
		copy(dlogits[t*E:(t+1)*E], d)
	}
}

// softmaxBack writes dx = p ⊙ (dp − Σ p·dp).
func softmaxBack(dx, p, dp []float64) {
	var dot float64
	for i := range p {
		dot += float64(p[i] * dp[i])
	}
	for i := range p {
		dx[i] = p[i] * (dp[i] - dot)
	}
}

// UpdateExpertBias is get_updated_expert_bias on counts already summed over
// the TP×DP×CP group: b_i += rate·sign(mean(c) − c_i).
func UpdateExpertBias(bias []float32, counts []float64, rate float64) {
	var mean float64
	for _, c := range counts {
		mean += c
	}
	mean /= float64(len(counts))
	for i, c := range counts {
		switch off := mean - c; {
		case off > 0:
			bias[i] += float32(rate) // fp32, as the fp32 bias buffer
		case off < 0:
			bias[i] -= float32(rate)
		}
	}
}

// RouterExp (exported for the kernels' host test) is e^x from float64 additions, products and one division, each
// rounded on its own (float64(...) forbids fused multiply-adds): FreeBSD's
// algorithm, as Go's portable math.exp, with its own power-of-two scaling.
// The router's scores use it instead of math.Exp, which on amd64 is
// assembly that uses FMA where the CPU has it, so that the CUDA router
// (moe.cu's moe_exp, the same operations) computes the same bits and
// chooses the same experts.
func RouterExp(x float64) float64 {
	const (
		ln2Hi     = 6.93147180369123816490e-01
		ln2Lo     = 1.90821492927058770002e-10
		log2e     = 1.44269504088896338700e+00
		overflow  = 7.09782712893383973096e+02
		underflow = -7.45133219101941108420e+02
		nearZero  = 1.0 / (1 << 28)
		p1        = 1.66666666666666657415e-01
		p2        = -2.77777777770155933842e-03
		p3        = 6.61375632143793436117e-05
		p4        = -1.65339022054652515390e-06
		p5        = 4.13813679705723846039e-08
	)
	switch {
	case x != x: // NaN
		return x
	case x > overflow:
		return math.Inf(1)
	case x < underflow:
		return 0
	case -nearZero < x && x < nearZero:
		return 1 + x
	}
	var k int
	switch {
	case x < 0:
		k = int(float64(log2e*x) - 0.5)
	case x > 0:
		k = int(float64(log2e*x) + 0.5)
	}
	hi := x - float64(float64(k)*ln2Hi)
	lo := float64(float64(k) * ln2Lo)
	r := hi - lo
	t := float64(r * r)
	c := r - float64(t*(p1+float64(t*(p2+float64(t*(p3+float64(t*(p4+float64(t*p5)))))))))
	y := 1 - ((lo - float64(r*c)/(2-c)) - hi)
	// y·2^k: exact, or rounded once where the result is subnormal
	switch {
	case k < -1021:
		return float64(y*pow2(k+53)) * pow2(-53)
	case k > 1023:
		return float64(y*pow2(1023)) * pow2(k-1023)
	}
	return y * pow2(k)
}

// RouterLog (exported for the kernels' host test) is the natural log from
// float64 additions, products and one division, each rounded on its own
// (float64(...) forbids fused multiply-adds): FreeBSD's algorithm, as Go's
// portable math.log, with the reduction x = f·2^k by the bits. The z-loss's
// log-sum-exp uses it instead of math.Log (assembly on amd64) so that the
// CUDA router's moe_log, the same operations, computes the same bits.
func RouterLog(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
		l1    = 6.666666666666735130e-01
		l2    = 3.999999999940941908e-01
		l3    = 2.857142874366239149e-01
		l4    = 2.222219843214978396e-01
		l5    = 1.818357216161805012e-01
		l6    = 1.531383769920937332e-01
		l7    = 1.479819860511658591e-01
	)
	switch {
	case x != x || x > math.MaxFloat64: // NaN, +Inf
		return x
	case x < 0:
		return math.NaN()
	case x == 0:
		return math.Inf(-1)
	}
	// x = f1·2^ki with f1 in [1/√2, √2) (subnormals scaled by 2^52 first)
	ki := 0
	if math.Float64bits(x)>>52 == 0 {
		x *= 1 << 52
		ki = -52
	}
	bits := math.Float64bits(x)
	ki += int(bits>>52&0x7ff) - 1022
	f1 := math.Float64frombits(bits&^(0x7ff<<52) | 1022<<52) // in [0.5, 1)
	if f1 < math.Sqrt2/2 {
		f1 *= 2
		ki--
	}
	f := f1 - 1
	k := float64(ki)
	s := f / (2 + f)
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := float64(s2 * (l1 + float64(s4*(l3+float64(s4*(l5+float64(s4*l7)))))))
	t2 := float64(s4 * (l2 + float64(s4*(l4+float64(s4*l6)))))
	r := t1 + t2
	hfsq := float64(float64(0.5*f) * f)
	return float64(k*ln2Hi) - ((hfsq - (float64(s*(hfsq+r)) + float64(k*ln2Lo))) - f)
}

// pow2 is 2^n for -1022 <= n <= 1023.
func pow2(n int) float64 { return math.Float64frombits(uint64(n+1023) << 52) }
