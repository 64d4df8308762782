package infer

import "testing"

// TestPromptTopLogprobs: the top log-probabilities of prompt position i
// (Megatron's prompt_top_n_logprobs) are those the engine reports for the
// first token generated after the prompt's first i+1 tokens, across
// prefill chunks of 4 tokens; the prompt's log-probabilities are still
// reported, and a request without PromptTopLogprobs gets none.
func TestPromptTopLogprobs(t *testing.T) {
	m := testModel(t, "gpt")
	prompt := testPrompt(11, 7, 64)
	e := mustEngine(t, m, EngineConfig{MaxNumBatchedTokens: 4})
	if _, err := e.Add(Request{Prompt: prompt, MaxTokens: 1, TopLogprobs: 3, PromptLogprobs: true, PromptTopLogprobs: true}); err != nil {
		t.Fatal(err)
	}
	var first Event
	for e.HasWork() {
		evs, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) > 0 && first.PromptLogprobs == nil {
			first = evs[0]
		}
	}
	if len(first.PromptTopLogprobs) != len(prompt)-1 || len(first.PromptLogprobs) != len(prompt)-1 {
		t.Fatalf("%d prompt top entries, %d prompt logprobs: want %d each", len(first.PromptTopLogprobs), len(first.PromptLogprobs), len(prompt)-1)
	}
	for i, got := range first.PromptTopLogprobs {
		e := mustEngine(t, m, EngineConfig{})
		e.Add(Request{Prompt: prompt[:i+1], MaxTokens: 1, TopLogprobs: 3, Sampling: Sampling{TopK: 1}})
		evs, err := e.Step()
		if err != nil || len(evs) != 1 {
			t.Fatalf("prefix %d: %v %+v", i+1, err, evs)
		}
		want := evs[0].TopLogprobs
		if len(got) != 3 {
			t.Fatalf("position %d: %d entries, want 3", i, len(got))
		}
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("position %d: %+v, decoding the prefix gives %+v", i, got, want)
			}
		}
	}
	e = mustEngine(t, m, EngineConfig{})
	e.Add(Request{Prompt: prompt, MaxTokens: 1, TopLogprobs: 3, PromptLogprobs: true})
	evs, _ := e.Step()
	if len(evs) != 1 || evs[0].PromptTopLogprobs != nil {
		t.Fatalf("without PromptTopLogprobs: %+v", evs)
	}
}
