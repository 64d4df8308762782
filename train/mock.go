package train

import (
	datagpt "github.com/gotron/gotron/data/gpt"
)

// MockSource is --mock-data: synthetic samples that are a pure function of
// the sample index. Each sample is an arithmetic sequence of token ids
// modulo the vocabulary with a per-sample start and stride, so a model can
// learn it and the loss falls.
type MockSource struct {
	SeqLength int
	VocabSize int // ids drawn from [0, VocabSize)
	Samples   int // Len(); 0 means 1<<30
}

var _ datagpt.Source = MockSource{}

// Len returns the number of samples.
func (m MockSource) Len() int {
	if m.Samples > 0 {
		return m.Samples
	}
	return 1 << 30
}

// Sample returns sample i.
func (m MockSource) Sample(i int) (datagpt.Sample, error) {
	h := splitmix(uint64(i))
	v := uint64(m.VocabSize)
	start, stride := h%v, 1+(h>>32)%7
	s := datagpt.Sample{
		Tokens: make([]int32, m.SeqLength), Labels: make([]int32, m.SeqLength),
		LossMask: make([]float32, m.SeqLength), PositionIDs: make([]int32, m.SeqLength),
	}
	for t := range m.SeqLength {
		s.Tokens[t] = int32((start + uint64(t)*stride) % v)
		s.Labels[t] = int32((start + uint64(t+1)*stride) % v)
		s.LossMask[t] = 1
		s.PositionIDs[t] = int32(t)
	}
	return s, nil
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}
