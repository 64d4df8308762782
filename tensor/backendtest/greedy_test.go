package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// checkGreedy runs greedy-only draws (the CUDA backend's device argmax)
// over rows with ties, NaNs (in column 0 too) and a padded tail, against
// the CPU backend's draws.
func checkGreedy(be tensor.Backend) error {
	rows, V, vocab := 4, 1030, 1000
	logits := samplingLogits(rows, V, vocab, 3)
	nan := float32(math.NaN())
	logits[0*V+17], logits[0*V+900] = 50, 50 // tie: the lower id wins
	logits[1*V+0] = nan                      // NaN first: the CPU keeps id 0
	logits[2*V+5], logits[2*V+6] = nan, 60   // a later NaN never wins
	logits[3*V+vocab+3] = 1e9                // past the vocabulary: ignored
	var draws []tensor.TokenSampling
	for i := range 2 * rows {
		draws = append(draws, tensor.TokenSampling{Row: (i * 3) % rows, Temperature: 1, TopK: 1})
	}
	dev := be.Device()
	got := tensor.NewOn(dev, tensor.Int32, len(draws))
	be.SampleTokens(tensor.SampledTokens{IDs: got}, onDev(dev, logits, rows, V), vocab, draws)
	want := tensor.New(tensor.Int32, len(draws))
	tensor.CPUBackend().SampleTokens(tensor.SampledTokens{IDs: want}, tensor.FromFloat32(logits, rows, V), vocab, draws)
	g, w := hostIDs(got), want.Int32s()
	for i := range w {
		if g[i] != w[i] {
			return fmt.Errorf("greedy draw %d (row %d): %d, want %d", i, draws[i].Row, g[i], w[i])
		}
	}
	return nil
}

func TestGreedySample(t *testing.T) {
	if err := checkGreedy(strict{tensor.SimBackend()}); err != nil {
		t.Error(err)
	}
}

// TestCUDAGreedySample runs checkGreedy on the GPU (skipped without one).
func TestCUDAGreedySample(t *testing.T) {
	be := cudaBackend(t)
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return checkGreedy(strict{be})
	}()
	if err != nil {
		t.Error(err)
	}
}
