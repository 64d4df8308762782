package infer

import (
	"fmt"
	"time"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// WeightLayout chooses how decode steps read the linear weights.
type WeightLayout int

const (
	// WeightsAuto (the zero value) keeps transposed copies when a timing
	// at NewEngine shows a one-row product at least 1.3× faster with them
	// (CPU GEMM paths without a dot-product kernel repack the model's
	// (out, in) weights on every call).
	WeightsAuto WeightLayout = iota
	// WeightsModel uses the model's weights only: a lone sequence then
	// decodes with gotron generate's arithmetic exactly.
	WeightsModel
	// WeightsTransposed always keeps the copies (double weight memory).
	WeightsTransposed
)

// Products of at most transposedMaxRows rows read the transposed copies
// (the AVX2 micro-kernel's height, up to which the GEMM reads a row-major
// weight in place); larger ones read the model's weights. Measured on two
// AVX2 cores, GPT-2 124M decode steps (medians of three, interleaved): 4
// sequences 72 ms with the copies against 136 ms without; 8 sequences 164
// against 133 ms and 16 sequences 212 against 145 ms when the copies were
// read 6 rows at a time, so larger products do not use them.
const transposedMaxRows = 6

// ParseWeightLayout reads "auto", "model" or "transposed".
func ParseWeightLayout(s string) (WeightLayout, error) {
	switch s {
	case "auto", "":
		return WeightsAuto, nil
	case "model":
		return WeightsModel, nil
	case "transposed":
		return WeightsTransposed, nil
	}
	return 0, fmt.Errorf("infer: weight layout %q: want auto, model or transposed", s)
}

// String returns the layout's name.
func (l WeightLayout) String() string {
	return [...]string{"auto", "model", "transposed"}[l]
}

// transposedLinears returns the copies the layout asks for (nil: none).
func transposedLinears(m *gpt.Model, l WeightLayout) *gpt.TransposedLinears {
	switch l {
	case WeightsModel:
		return nil
	case WeightsTransposed:
		return m.TransposeLinears(transposedMaxRows)
	}
	if oneRowSpeedup(m) < 1.3 {
		return nil
	}
	return m.TransposeLinears(transposedMaxRows)
}

// oneRowSpeedup times a one-row product with the first layer's largest
// weight in the model's layout and transposed, best of five each, and
// returns the ratio.
func oneRowSpeedup(m *gpt.Model) float64 {
	l := &m.Layers[0]
	w := l.FC1
	if l.FC2.Numel() > w.Numel() {
		w = l.FC2
	}
	probe := &gpt.Model{Layers: []gpt.Layer{{FC1: w}}}
	tl := probe.TransposeLinears(1)
	x := tensor.FromFloat32(make([]float32, w.Dim(1)), 1, 1, w.Dim(1))
	var tp *tensor.Tape
	best := func(f func()) time.Duration {
		f()
		b := time.Duration(1 << 62)
		for range 5 {
			t := time.Now()
			f()
			b = min(b, time.Since(t))
		}
		return b
	}
	model := best(func() { tp.Linear(x, w, nil) })
	trans := best(func() { tl.Linear(tp, x, w, nil) })
	return float64(model) / float64(max(trans, 1))
}
