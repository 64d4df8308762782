package infer

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
)

// TestEngineRefusesImpossibleLengths (issue 31, finding 1, in depth): a
// MaxTokens near 2^63 wrapped len(Prompt)+MaxTokens negative, passed
// Validate and panicked in newSequence (makeslice: cap out of range) on the
// runner's goroutine. The engine now refuses it, and any length beyond its
// context, with an error; a TopLogprobs beyond the vocabulary (which sized
// the step's buffers) likewise.
func TestEngineRefusesImpossibleLengths(t *testing.T) {
	m := testModel(t, "gpt")
	e := mustEngine(t, m, EngineConfig{BlockTokens: 8})
	prompt := testPrompt(5, 1, 64)
	for _, r := range []Request{
		{Prompt: prompt, MaxTokens: math.MaxInt},
		{Prompt: prompt, MaxTokens: math.MaxInt - 4},
		{Prompt: prompt, MaxTokens: 124},
	} {
		if _, err := e.Add(r); !errors.Is(err, ErrContextLength) {
			t.Errorf("Add(MaxTokens %d) = %v, want ErrContextLength", r.MaxTokens, err)
		}
	}
	if _, err := e.Add(Request{Prompt: prompt, MaxTokens: 1, TopLogprobs: math.MaxInt}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("Add(TopLogprobs MaxInt) = %v, want ErrBadRequest", err)
	}
	// Below Validate: newSequence itself refuses what it cannot allocate.
	if _, err := newSequence(0, Request{Prompt: prompt, MaxTokens: math.MaxInt}, nil, 128); !errors.Is(err, ErrContextLength) {
		t.Errorf("newSequence(MaxTokens MaxInt) = %v", err)
	}
	if _, err := newSequence(0, Request{Prompt: prompt, MaxTokens: 1 << 40}, nil, 128); !errors.Is(err, ErrContextLength) {
		t.Errorf("newSequence(MaxTokens 2^40) = %v", err)
	}
	if _, err := e.Add(Request{Prompt: prompt, MaxTokens: 123}); err != nil {
		t.Errorf("Add(the whole context) = %v", err)
	}
	// Generate (gotron generate's loop) stops when the context is full.
	sm, _ := NewSampler(Sampling{TopK: 1})
	n := 0
	if err := Generate(context.Background(), m, prompt, math.MaxInt, 0, -1, sm, func(int) error { n++; return nil }); err != nil || n != 124 {
		t.Errorf("Generate(maxNew MaxInt): %d tokens, %v; want 124 (the context's 128 positions less the prompt's 5, and the token the last position predicts)", n, err)
	}
	if err := Generate(context.Background(), m, prompt, -1, 0, -1, sm, func(int) error { return nil }); err == nil {
		t.Error("Generate(maxNew -1) accepted")
	}
}

// TestGreedyTemperatures (issue 31, finding 8): a temperature positive in
// float64 but 0 in float32 divided the logits into infinities and sampled
// garbage; it is now greedy. Non-finite temperatures are refused.
func TestGreedyTemperatures(t *testing.T) {
	m := testModel(t, "llama")
	prompt := testPrompt(6, 3, 64)
	want := generateAlone(t, m, prompt, 10, Sampling{TopK: 1})
	for _, temp := range []float64{5e-324, 1e-300, 7e-46} {
		if !IsGreedyTemperature(temp) {
			t.Errorf("IsGreedyTemperature(%g) = false", temp)
		}
		if got := generateAlone(t, m, prompt, 10, Sampling{Temperature: temp, Seed: 9}); !slices.Equal(got, want) {
			t.Errorf("temperature %g: %v, want greedy %v", temp, got, want)
		}
	}
	for _, temp := range []float64{0, 1e-30, 1, -1} {
		if IsGreedyTemperature(temp) {
			t.Errorf("IsGreedyTemperature(%g) = true", temp)
		}
	}
	for _, temp := range []float64{math.Inf(1), math.NaN(), -1} {
		if _, err := NewSampler(Sampling{Temperature: temp}); err == nil {
			t.Errorf("NewSampler(temperature %g) accepted", temp)
		}
	}
	// The engine's batched path samples greedily too.
	e := mustEngine(t, m, EngineConfig{BlockTokens: 8})
	id, err := e.Add(Request{Prompt: prompt, MaxTokens: 10, Sampling: Sampling{Temperature: 5e-324, Seed: 4}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := drain(t, e)
	if !slices.Equal(out[id], want) {
		t.Errorf("engine, temperature 5e-324: %v, want %v", out[id], want)
	}
}
