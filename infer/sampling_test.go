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

type spaceDecoder struct{}

func (spaceDecoder) Decode(ids []int) string {
	var b []byte
	for i, id := range ids {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, byte('0'+id))
	}
	return string(b)
}

type byteDecoder struct{}

func (byteDecoder) Decode(ids []int) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return string(b)
}

func TestTextStream(t *testing.T) {
	s := NewTextStream(spaceDecoder{}, []int{1, 2})
	if got := s.Add(3) + s.Add(4); got != " 3 4" {
		t.Fatalf("space-joined stream gave %q", got)
	}
	// "é" is two bytes: nothing is emitted until the character is whole.
	b := NewTextStream(byteDecoder{}, []int{'a'})
	if got := b.Add(0xc3); got != "" {
		t.Fatalf("half a character emitted: %q", got)
	}
	if got := b.Add(0xa9); got != "é" {
		t.Fatalf("got %q", got)
	}
}
