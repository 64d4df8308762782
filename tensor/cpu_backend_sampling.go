package tensor

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/gotron/gotron/internal/cpu"
)

// The CPU backend's SampleTokens (sampling_ops.go).

func (cpuBackend) SampleTokens(out SampledTokens, logits *Tensor, vocab int, draws []TokenSampling) {
	V, lg, ids := logits.Dim(1), f(logits), out.IDs.i32s()
	var lps, topLP []float32
	var topIDs []int32
	k := 0
	if out.Logprobs != nil {
		lps = f(out.Logprobs)
	}
	if out.TopIDs != nil {
		topIDs, topLP, k = out.TopIDs.i32s(), f(out.TopLogprobs), out.TopIDs.Dim(1)
	}
	// One draw per work item: with many sequences the passes over the
	// vocabulary would otherwise run on one thread while the others wait.
	cpu.Parallel(len(draws), 1, func(lo, hi int) {
		sc, _ := sampleScratches.Get().(*sampleScratch)
		if sc == nil {
			sc = &sampleScratch{}
		}
		defer sampleScratches.Put(sc)
		for i := lo; i < hi; i++ {
			d := &draws[i]
			row := lg[d.Row*V : d.Row*V+vocab]
			id := sc.sample(row, d)
			ids[i] = int32(id)
			if !d.Logprob && d.TopLogprobs == 0 {
				continue
			}
			lse := logSumExp(row)
			if d.Logprob {
				lps[i] = float32(float64(row[id]) - lse)
			}
			if d.TopLogprobs > 0 {
				sc.topLogprobs(topIDs[i*k:(i+1)*k], topLP[i*k:(i+1)*k], row, d.TopLogprobs, lse)
			}
		}
	})
}

func (cpuBackend) TokenLogprobs(out, logits, targets *Tensor, vocab int) {
	V, lg, o, tg := logits.Dim(1), f(logits), f(out), targets.i32s()
	for i, t := range tg {
		if t < 0 || int(t) >= vocab {
			panic(fmt.Sprintf("tensor: TokenLogprobs: row %d's target %d outside the vocabulary of %d", i, t, vocab))
		}
	}
	cpu.Parallel(len(tg), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := lg[i*V : i*V+vocab]
			o[i] = float32(float64(row[tg[i]]) - logSumExp(row))
		}
	})
}

// sampleScratch is one goroutine's working memory for a draw.
type sampleScratch struct {
	probs []float64
	order []int // candidate ids; a heap while selecting
	kept  []int // the kept ids, most probable first
	top   []idLogit
}

type idLogit struct {
	id int
	v  float32
}

var sampleScratches sync.Pool

// sample returns the token d draws from logits.
//
// With top-k or top-p the kept tokens are visited most probable first
// (equal logits: lower id first). They are found by partial selection, not
// by sorting the vocabulary: a size-k heap for top-k (O(V log k)), and for
// top-p a heap over the vocabulary popped only until the mass reaches p.
func (s *sampleScratch) sample(logits []float32, d *TokenSampling) int {
	if d.TopK == 1 {
		return argmax(logits)
	}
	n := len(logits)
	if cap(s.probs) < n {
		s.probs, s.order = make([]float64, n), make([]int, n)
	}
	p, order := s.probs[:n], s.order[:n]
	for i, l := range logits {
		p[i] = float64(l) / d.Temperature
		order[i] = i
	}
	kept := order // no filtering: every id, in id order
	switch {
	case d.TopK > 1:
		kept = s.selectTopK(p, order, min(d.TopK, n))
	case d.TopP > 0:
		return s.sampleTopP(p, order, d)
	}
	// softmax over the kept ids (most probable first when filtering)
	mx := math.Inf(-1)
	for _, i := range kept {
		mx = math.Max(mx, p[i])
	}
	var sum float64
	for _, i := range kept {
		p[i] = math.Exp(p[i] - mx)
		sum += p[i]
	}
	return pick(p, kept, sum, d.U)
}

// sampleTopP keeps the smallest run of most probable tokens whose mass
// reaches TopP (Megatron: a token is dropped when the cumulative
// probability before it already exceeds p, so the first always stays) and
// draws from it. order holds every id and becomes a heap.
func (s *sampleScratch) sampleTopP(p []float64, order []int, d *TokenSampling) int {
	mx := math.Inf(-1)
	for _, v := range p {
		mx = math.Max(mx, v)
	}
	var sum float64
	for i := range p {
		p[i] = math.Exp(p[i] - mx)
		sum += p[i]
	}
	better := func(a, b int) bool { return p[a] > p[b] || p[a] == p[b] && a < b }
	h := order
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i, better)
	}
	kept, cum, limit := s.kept[:0], 0.0, d.TopP*sum
	for len(h) > 0 && cum <= limit {
		i := h[0]
		h[0] = h[len(h)-1]
		h = h[:len(h)-1]
		siftDown(h, 0, better)
		kept = append(kept, i)
		cum += p[i]
	}
	s.kept = kept
	sum = 0
	for _, i := range kept {
		sum += p[i]
	}
	return pick(p, kept, sum, d.U)
}

// selectTopK returns the k ids of largest p, largest first, keeping them in
// a min-heap of size k (root: the worst kept) while scanning order.
func (s *sampleScratch) selectTopK(p []float64, order []int, k int) []int {
	worse := func(a, b int) bool { return p[a] < p[b] || p[a] == p[b] && a > b }
	h := append(s.kept[:0], order[:k]...)
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(h, i, worse)
	}
	for _, i := range order[k:] {
		if worse(h[0], i) {
			h[0] = i
			siftDown(h, 0, worse)
		}
	}
	s.kept = h
	sort.Slice(h, func(a, b int) bool { return worse(h[b], h[a]) })
	return h
}

// siftDown restores the heap property below h[i], where before(a, b) means
// a belongs nearer the root than b.
func siftDown(h []int, i int, before func(a, b int) bool) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && before(h[c+1], h[c]) {
			c++
		}
		if !before(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// pick returns the one of kept at which u·sum falls below the running sum
// of p (the last one if rounding leaves a remainder).
func pick(p []float64, kept []int, sum float64, u float32) int {
	r := float64(u) * sum
	for _, i := range kept {
		r -= p[i]
		if r < 0 {
			return i
		}
	}
	return kept[len(kept)-1]
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// logSumExp returns log Σ exp(x) in float64, shifted by the maximum.
func logSumExp(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(sum)
}

// topLogprobs writes into ids and lps the k largest logits' tokens, most
// likely first (ties: lower id first), with their log-probabilities.
func (s *sampleScratch) topLogprobs(ids []int32, lps []float32, x []float32, k int, lse float64) {
	k = min(k, len(x))
	top := s.top[:0]
	for id, v := range x {
		if len(top) == k && v <= top[k-1].v {
			continue
		}
		i := len(top)
		for i > 0 && top[i-1].v < v {
			i--
		}
		top = slices.Insert(top, i, idLogit{id, v})
		if len(top) > k {
			top = top[:k]
		}
	}
	s.top = top
	for i, t := range top {
		ids[i], lps[i] = int32(t.id), float32(float64(t.v)-lse)
	}
}
