package infer

import (
	"slices"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestEngineOnSimMatchesCPU serves the same requests — greedy, sampled,
// top-p with log-probabilities, prompt log-probabilities, a shared prefix —
// with a model on the simulated device and with the same model on the
// CPU, with the model's weights and packed float32 weights: the KV pool, the packed weights and every
// kernel then live on sim, whose host accessors panic, so a step that
// reached around the backend would fail; and every event must equal the
// CPU's bit for bit. The host copies per step are the step's inputs and
// its logits, not a copy per layer.
func TestEngineOnSimMatchesCPU(t *testing.T) {
	reqs := []Request{
		{Prompt: testPrompt(9, 1, 64), MaxTokens: 6, Sampling: Sampling{TopK: 1}},
		{Prompt: testPrompt(20, 2, 64), MaxTokens: 5, Sampling: Sampling{Temperature: 0.8, TopK: 5, Seed: 3}, Logprobs: true, TopLogprobs: 3},
		{Prompt: testPrompt(5, 3, 64), MaxTokens: 7, Sampling: Sampling{TopP: 0.9, Seed: 4}, Logprobs: true},
		{Prompt: testPrompt(12, 4, 64), MaxTokens: 1, PromptLogprobs: true},
		{Prompt: append(testPrompt(20, 2, 64), 7, 8), MaxTokens: 4, Sampling: Sampling{Seed: 5}},
	}
	serve := func(cfg EngineConfig, sim bool, bf16 bool) ([]Event, int) {
		m := weightCaseModel(t, "llama", bf16)
		if sim {
			m.ToDevice(tensor.Sim)
		}
		e := mustEngine(t, m, cfg)
		if got := e.pool.k[0].Device(); got != m.Device() {
			t.Fatalf("KV pool on %v, model on %v", got, m.Device())
		}
		for _, r := range reqs {
			if _, err := e.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		var evs []Event
		steps := 0
		for ; e.HasWork(); steps++ {
			s, err := e.Step()
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, s...)
		}
		checkNoLeak(t, e)
		return evs, steps
	}
	for _, wc := range weightCases {
		cfg := EngineConfig{Weights: wc.layout, BF16: wc.bf16, BlockTokens: 4, MaxNumBatchedTokens: 16}
		want, _ := serve(cfg, false, wc.bf16)
		before := tensor.SimTransfers()
		got, steps := serve(cfg, true, wc.bf16)
		after := tensor.SimTransfers()
		if len(got) != len(want) {
			t.Fatalf("%s: %d events on sim, %d on the CPU", wc.name, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Seq != w.Seq || g.Token != w.Token || g.Finish != w.Finish || g.Logprob != w.Logprob ||
				!slices.Equal(g.TopLogprobs, w.TopLogprobs) || !slices.Equal(g.PromptLogprobs, w.PromptLogprobs) {
				t.Fatalf("%s: event %d on sim %+v, on the CPU %+v", wc.name, i, g, w)
			}
		}
		// Out of sim, per step: the drawn ids and log-probabilities (and
		// the top ones, and prompt log-probabilities, when asked) — a few
		// bytes per sequence, never a logits row (V floats). In: the model's
		// parameters once (and, with bf16, rounded through the host once),
		// then per step its tokens, positions, the attention's tables and
		// the prompt log-probabilities' targets.
		toHost, fromHost := after.ToHost-before.ToHost, after.FromHost-before.FromHost
		params := int64(len(weightCaseModel(t, "llama", wc.bf16).Params()))
		V := int64(weightCaseModel(t, "llama", wc.bf16).Config.VocabSize)
		if toHost > int64(5*steps)+2*params || fromHost > 3*params+int64(6*(steps+1)) {
			t.Errorf("%s: %d steps copied %d tensors out of sim and %d in (%d parameters)", wc.name, steps, toHost, fromHost, params)
		}
		// A logits row is V floats; the draws are a few values a sequence.
		// With bf16 the engine checks the weights' rounding on the host
		// once (gpt.Model.CheckBF16).
		out := after.ToHostBytes - before.ToHostBytes
		if wc.bf16 {
			out -= paramBytes(weightCaseModel(t, "llama", wc.bf16).Params())
		}
		if rows := int64(len(reqs)); out >= rows*4*V {
			t.Errorf("%s: %d steps copied %d bytes out of sim: logits rows (V=%d), not just the draws", wc.name, steps, out, V)
		}
	}
}

// paramBytes is the float32 size of ps.
func paramBytes(ps []*tensor.Tensor) int64 {
	var n int64
	for _, p := range ps {
		n += int64(p.Numel() * 4)
	}
	return n
}
