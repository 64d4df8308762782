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
	order []int
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
	if s.cfg.TopK > 1 || s.cfg.TopP > 0 {
		sort.Slice(order, func(a, b int) bool { return p[order[a]] > p[order[b]] })
	}
	keep := n
	if s.cfg.TopK > 1 && s.cfg.TopK < n {
		keep = s.cfg.TopK
	}
	// softmax over the kept ids (in sorted order when filtering)
	mx := math.Inf(-1)
	for _, i := range order[:keep] {
		mx = math.Max(mx, p[i])
	}
	var sum float64
	for _, i := range order[:keep] {
		p[i] = math.Exp(p[i] - mx)
		sum += p[i]
	}
	if s.cfg.TopP > 0 {
		// Drop tokens whose cumulative probability before them already
		// exceeds p: the mask shifted right by one keeps the first token.
		cum := 0.0
		for k, i := range order[:keep] {
			if cum > s.cfg.TopP*sum {
				keep = k
				break
			}
			cum += p[i]
		}
		sum = 0
		for _, i := range order[:keep] {
			sum += p[i]
		}
	}
	s.rng.Uniform(s.u[:], 0, 1)
	r := float64(s.u[0]) * sum
	for _, i := range order[:keep] {
		r -= p[i]
		if r < 0 {
			return i
		}
	}
	return order[keep-1]
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
