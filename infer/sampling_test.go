package infer

import (
	"testing"
)

func TestSamplingRules(t *testing.T) {
	logits := []float32{1, 5, 3, 4, 2}
	greedy, _ := NewSampler(Sampling{TopK: 1})
	if id := greedy.Sample(logits); id != 1 {
		t.Fatalf("top-k 1 gave %d, want argmax 1", id)
	}
	topk, _ := NewSampler(Sampling{TopK: 2, Seed: 3})
	seen := map[int]int{}
	for range 2000 {
		seen[topk.Sample(logits)]++
	}
	if len(seen) != 2 || seen[1] == 0 || seen[3] == 0 {
		t.Fatalf("top-k 2 drew %v, want only ids 1 and 3", seen)
	}
	// softmax(5,4) = 0.731, 0.269
	if f := float64(seen[1]) / 2000; f < 0.69 || f > 0.77 {
		t.Fatalf("top-k 2 drew id 1 with frequency %.3f, want ≈ 0.731", f)
	}
	// top-p 0.5: the first token alone has 0.64 of the full softmax mass, so
	// only it survives.
	topp, _ := NewSampler(Sampling{TopP: 0.5, Seed: 1})
	for range 200 {
		if id := topp.Sample(logits); id != 1 {
			t.Fatalf("top-p 0.5 drew %d", id)
		}
	}
	// Seeded: the same seed gives the same draws.
	a, _ := NewSampler(Sampling{Seed: 9})
	b, _ := NewSampler(Sampling{Seed: 9})
	for range 100 {
		if a.Sample(logits) != b.Sample(logits) {
			t.Fatal("same seed, different draws")
		}
	}
	if _, err := NewSampler(Sampling{TopK: 5, TopP: 0.9}); err == nil {
		t.Fatal("top-k with top-p accepted")
	}
}
