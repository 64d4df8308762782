package infer

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// sortedSample is Sampler.Sample before partial selection: the whole
// vocabulary sorted for top-k and top-p. The reference for
// TestPartialSelectionSamplesAsSorting.
func sortedSample(s *Sampler, logits []float32) int {
	if s.cfg.TopK == 1 {
		return argmax(logits)
	}
	n := len(logits)
	p, order := make([]float64, n), make([]int, n)
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

// TestPartialSelectionSamplesAsSorting: for the same seed, Sample draws the
// same ids as the sorting implementation it replaced, for top-k, top-p and
// plain sampling, on logits without ties. (Top-p normalises by the total
// mass summed in id order instead of sorted order; the two sums differ in
// the last bits, which changes a draw only when it falls within ~1e-12 of a
// boundary.)
func TestPartialSelectionSamplesAsSorting(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	configs := []Sampling{
		{}, {Temperature: 0.7}, {TopK: 2}, {TopK: 5}, {TopK: 50, Temperature: 0.8}, {TopK: 900}, {TopK: 5000},
		{TopP: 0.1}, {TopP: 0.5}, {TopP: 0.9, Temperature: 0.7}, {TopP: 0.99}, {TopP: 1},
	}
	for _, n := range []int{3, 1000, 50257} {
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		draws := 400
		for ci, c := range configs {
			if n > 10000 { // GPT-2's vocabulary: a few draws of the main cases
				if c.TopK != 50 && c.TopP != 0.9 {
					continue
				}
				draws = 5
			}
			c.Seed = uint64(ci + 1)
			got, _ := NewSampler(c)
			want, _ := NewSampler(c)
			for d := range draws {
				g, w := got.Sample(logits), sortedSample(want, logits)
				if g != w {
					t.Fatalf("V=%d %+v draw %d: partial selection %d, sorting %d", n, c, d, g, w)
				}
			}
		}
	}
}

func benchmarkSample(b *testing.B, c Sampling) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 50257)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	s, _ := NewSampler(c)
	for b.Loop() {
		s.Sample(logits)
	}
}

func BenchmarkSamplePlain(b *testing.B) { benchmarkSample(b, Sampling{}) }
func BenchmarkSampleTopK(b *testing.B)  { benchmarkSample(b, Sampling{TopK: 50}) }
func BenchmarkSampleTopP(b *testing.B)  { benchmarkSample(b, Sampling{TopP: 0.9}) }

// BenchmarkSampleSorted is the replaced implementation, for comparison.
func BenchmarkSampleSorted(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 50257)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	s, _ := NewSampler(Sampling{TopP: 0.9})
	for b.Loop() {
		sortedSample(s, logits)
	}
}
