// Package infer generates text from a model: Megatron's sampling rules over
// KV-cached incremental decoding.
package infer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Sampling is Megatron's SamplingParams subset (spec §1.16).
type Sampling struct {
	// Temperature divides the logits; 0 means 1.
	Temperature float64
	// TopK keeps the k largest logits (0: off; 1: greedy argmax).
	TopK int
	// TopP keeps the smallest prefix of tokens sorted by probability whose
	// mass reaches p (the first token always survives); 0: off. Setting both
	// TopK > 1 and TopP is an error, as in Megatron.
	TopP float64
	// Seed seeds the multinomial draw.
	Seed uint64
}

// Validate rejects combinations Megatron rejects.
func (s Sampling) Validate() error {
	switch {
	case s.TopK < 0:
		return fmt.Errorf("infer: --top-k=%d: want >= 0", s.TopK)
	case s.TopP < 0 || s.TopP > 1:
		return fmt.Errorf("infer: --top-p=%g: want 0 <= p <= 1", s.TopP)
	case s.TopK > 1 && s.TopP > 0:
		return errors.New("infer: --top-k and --top-p cannot both be set (Megatron's rule)")
	case s.Temperature < 0:
		return fmt.Errorf("infer: --temperature=%g: want > 0", s.Temperature)
	}
	return nil
}

// Sampler draws token ids from logits.
type Sampler struct {
	cfg   Sampling
	rng   *tensor.RNG
	u     [1]float32
	probs []float64
	order []int // candidate ids; a heap while selecting
	kept  []int // the kept ids, most probable first
}

// NewSampler returns a sampler with its own seeded stream.
func NewSampler(cfg Sampling) (*Sampler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Temperature == 0 {
		cfg.Temperature = 1
	}
	return &Sampler{cfg: cfg, rng: tensor.NewRNG(cfg.Seed).Fork("sampling")}, nil
}

// Sample returns the next id given logits over the vocabulary.
//
// With top-k or top-p the kept tokens are visited most probable first
// (equal logits: lower id first). They are found by partial selection, not
// by sorting the vocabulary: a size-k heap for top-k (O(V log k)), and for
// top-p a heap over the vocabulary popped only until the mass reaches p.
func (s *Sampler) Sample(logits []float32) int {
	if s.cfg.TopK == 1 {
		return argmax(logits)
	}
	n := len(logits)
	if cap(s.probs) < n {
		s.probs, s.order = make([]float64, n), make([]int, n)
	}
	p, order := s.probs[:n], s.order[:n]
	for i, l := range logits {
		p[i] = float64(l) / s.cfg.Temperature
		order[i] = i
	}
	kept := order // no filtering: every id, in id order
	switch {
	case s.cfg.TopK > 1:
		kept = s.selectTopK(p, order, min(s.cfg.TopK, n))
	case s.cfg.TopP > 0:
		return s.sampleTopP(p, order)
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
	return s.draw(p, kept, sum)
}

// sampleTopP keeps the smallest run of most probable tokens whose mass
// reaches TopP (Megatron: a token is dropped when the cumulative
// probability before it already exceeds p, so the first always stays) and
// draws from it. order holds every id and becomes a heap.
func (s *Sampler) sampleTopP(p []float64, order []int) int {
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
	kept, cum, limit := s.kept[:0], 0.0, s.cfg.TopP*sum
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
	return s.draw(p, kept, sum)
}

// selectTopK returns the k ids of largest p, largest first, keeping them in
// a min-heap of size k (root: the worst kept) while scanning order.
func (s *Sampler) selectTopK(p []float64, order []int, k int) []int {
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

// draw picks one of kept with probability p[i]/sum (one uniform draw).
func (s *Sampler) draw(p []float64, kept []int, sum float64) int {
	s.rng.Uniform(s.u[:], 0, 1)
	r := float64(s.u[0]) * sum
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

// Generate continues prompt by up to maxNew tokens, calling emit with each
// new id as it is produced (streaming). Generation stops early at stop (an
// end-of-document id; negative: none) or when ctx is done. vocab limits
// sampling to the tokenizer's real ids (the padded tail is never drawn).
func Generate(ctx context.Context, m *gpt.Model, prompt []int32, maxNew, vocab int, stop int, s *Sampler, emit func(id int) error) error {
	if len(prompt) == 0 {
		return errors.New("infer: empty prompt")
	}
	if vocab <= 0 || vocab > m.Config.VocabSize {
		vocab = m.Config.VocabSize
	}
	kv := m.NewKVCache(len(prompt) + maxNew)
	if len(prompt) > kv.MaxLen {
		return fmt.Errorf("infer: prompt of %d tokens exceeds the model's %d positions", len(prompt), kv.MaxLen)
	}
	logits, err := m.Decode(kv, prompt)
	if err != nil {
		return err
	}
	for range maxNew {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		id := s.Sample(logits[:vocab])
		if err := emit(id); err != nil {
			return err
		}
		if id == stop || kv.Len >= kv.MaxLen {
			return nil
		}
		if logits, err = m.Decode(kv, []int32{int32(id)}); err != nil {
			return err
		}
	}
	return nil
}
