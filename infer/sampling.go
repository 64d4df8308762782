// Package infer generates text from a model: Megatron's sampling rules over
// KV-cached incremental decoding.
package infer

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Sampling is a subset of Megatron's SamplingParams
// (megatron/core/inference/sampling_params.py).
type Sampling struct {
	// Temperature divides the logits; 0 means 1. A positive temperature
	// that is 0 in float32 (below ~7e-46: the logits divided by it overflow)
	// is greedy, the limit of ever smaller temperatures.
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
	case s.Temperature < 0 || math.IsNaN(s.Temperature) || math.IsInf(s.Temperature, 0):
		return fmt.Errorf("infer: --temperature=%g: want a finite number > 0", s.Temperature)
	}
	return nil
}

// IsGreedyTemperature reports whether t is a positive temperature that
// rounds to 0 in float32: dividing float32-sized logits by it overflows, so
// it is taken as its limit, greedy decoding (as temperature 0 is in the
// OpenAI API).
func IsGreedyTemperature(t float64) bool { return t > 0 && float32(t) == 0 }

// Sampler draws token ids from logits with its own seeded stream of
// uniform numbers (tensor.SampleTokens does the arithmetic).
type Sampler struct {
	cfg Sampling
	rng *tensor.RNG
	u   [1]float32
	id  [1]int32
	one [1]tensor.TokenSampling
}

// NewSampler returns a sampler with its own seeded stream.
func NewSampler(cfg Sampling) (*Sampler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Temperature == 0 {
		cfg.Temperature = 1
	}
	if IsGreedyTemperature(cfg.Temperature) {
		cfg.Temperature, cfg.TopK, cfg.TopP = 1, 1, 0
	}
	return &Sampler{cfg: cfg, rng: tensor.NewRNG(cfg.Seed).Fork("sampling")}, nil
}

// Sample returns the next id given logits over the vocabulary.
//
// With top-k or top-p the kept tokens are visited most probable first
// (equal logits: lower id first), found by partial selection rather than
// by sorting the vocabulary (tensor.SampleTokens).
func (s *Sampler) Sample(logits []float32) int {
	return s.SampleRow(tensor.FromFloat32(logits, 1, len(logits)), len(logits))
}

// SampleRow is Sample of logits (1, V) on any device, drawing among the
// first vocab ids (the tokenizer's; the padded tail is never drawn): the
// draw is made where the logits are and only the id is read back.
func (s *Sampler) SampleRow(logits *tensor.Tensor, vocab int) int {
	s.one[0] = s.next(0)
	ids := tensor.FromInt32(s.id[:], 1)
	sampleOn(logits.Device(), tensor.SampledTokens{IDs: ids}, logits, vocab, s.one[:])
	return int(ids.Int32s()[0]) // the draw, read back
}

// next returns the sampler's next draw, from logits row row: its rules
// and, unless it is greedy, the next uniform number of its stream (a
// greedy sampler draws none).
func (s *Sampler) next(row int) tensor.TokenSampling {
	d := tensor.TokenSampling{Row: row, Temperature: s.cfg.Temperature, TopK: s.cfg.TopK, TopP: s.cfg.TopP}
	if s.cfg.TopK != 1 {
		s.rng.Uniform(s.u[:], 0, 1)
		d.U = s.u[0]
	}
	return d
}

// Generate continues prompt by up to maxNew tokens, calling emit with each
// new id as it is produced (streaming). Generation stops early at stop (an
// end-of-document id; negative: none) or when ctx is done. vocab limits
// sampling to the tokenizer's real ids (the padded tail is never drawn).
func Generate(ctx context.Context, m *gpt.Model, prompt []int32, maxNew, vocab int, stop int, s *Sampler, emit func(id int) error) error {
	if len(prompt) == 0 {
		return errors.New("infer: empty prompt")
	}
	if maxNew < 0 {
		return fmt.Errorf("infer: %d new tokens: want >= 0", maxNew)
	}
	if vocab <= 0 || vocab > m.Config.VocabSize {
		vocab = m.Config.VocabSize
	}
	// Generation stops when the cache is full: more new tokens than the
	// model has positions are never needed (and their sum with the
	// prompt's could wrap).
	kv := m.NewKVCache(len(prompt) + min(maxNew, max(m.Config.MaxPositionEmbeddings, 1)))
	if len(prompt) > kv.MaxLen {
		return fmt.Errorf("infer: prompt of %d tokens exceeds the model's %d positions", len(prompt), kv.MaxLen)
	}
	logits, err := m.DecodeLogits(kv, prompt)
	if err != nil {
		return err
	}
	for range maxNew {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		id := s.SampleRow(logits, vocab)
		if err := emit(id); err != nil {
			return err
		}
		if id == stop || kv.Len >= kv.MaxLen {
			return nil
		}
		if logits, err = m.DecodeLogits(kv, []int32{int32(id)}); err != nil {
			return err
		}
	}
	return nil
}
