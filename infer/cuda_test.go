package infer

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestEngineOnCUDAMatchesCPU: on a GPU the serving engine — paged KV pool,
// packed weights, batched decode steps, greedy draws — produces the CPU's
// greedy tokens, and its log-probabilities within float32 tolerance (the
// products sum in cuBLAS's order). It skips without a GPU.
func TestEngineOnCUDAMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	reqs := []Request{
		{Prompt: testPrompt(9, 1, 64), MaxTokens: 6, Sampling: Sampling{TopK: 1}, Logprobs: true},
		{Prompt: testPrompt(20, 2, 64), MaxTokens: 5, Sampling: Sampling{TopK: 1}},
		{Prompt: testPrompt(12, 4, 64), MaxTokens: 1, PromptLogprobs: true},
		{Prompt: append(testPrompt(20, 2, 64), 7, 8), MaxTokens: 4, Sampling: Sampling{TopK: 1}},
	}
	serve := func(cfg EngineConfig, dev tensor.Device, bf16 bool) []Event {
		m := weightCaseModel(t, "llama", bf16)
		m.ToDevice(dev)
		e := mustEngine(t, m, cfg)
		for _, r := range reqs {
			if _, err := e.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		var evs []Event
		for e.HasWork() {
			s, err := e.Step()
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, s...)
		}
		checkNoLeak(t, e)
		return evs
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-3*math.Max(1, math.Abs(b)) }
	for _, wc := range weightCases {
		cfg := EngineConfig{Weights: wc.layout, BF16: wc.bf16, BlockTokens: 4, MaxNumBatchedTokens: 16}
		want, got := serve(cfg, tensor.CPU, wc.bf16), serve(cfg, tensor.CUDA, wc.bf16)
		if len(got) != len(want) {
			t.Fatalf("%s: %d events on cuda, %d on the CPU", wc.name, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Seq != w.Seq || g.Token != w.Token || g.Finish != w.Finish || !near(float64(g.Logprob), float64(w.Logprob)) ||
				len(g.PromptLogprobs) != len(w.PromptLogprobs) {
				t.Fatalf("%s: event %d on cuda %+v, on the CPU %+v", wc.name, i, g, w)
			}
			for j := range w.PromptLogprobs {
				if !near(float64(g.PromptLogprobs[j]), float64(w.PromptLogprobs[j])) {
					t.Fatalf("%s: event %d prompt logprob %d: %v on cuda, %v on the CPU", wc.name, i, j, g.PromptLogprobs[j], w.PromptLogprobs[j])
				}
			}
		}
	}
}
