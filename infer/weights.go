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

// Products of at most transposedMaxRows rows read the transposed copies,
// transposedChunkRows rows at a time (the AVX2 micro-kernel's height, for
// which the GEMM reads a row-major weight in place); larger ones read the
// model's weights, where the GEMM's packing is amortised. Measured on two
// AVX2 cores (docs/serving.md): chunks of 6 beat the model's layout up to
// 16 rows, and lose from 24.
const (
	transposedMaxRows   = 16
	transposedChunkRows = 6
)

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
		return m.TransposeLinears(transposedMaxRows, transposedChunkRows)
	}
	if oneRowSpeedup(m) < 1.3 {
		return nil
	}
	return m.TransposeLinears(transposedMaxRows, transposedChunkRows)
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
	tl := probe.TransposeLinears(1, 0)
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
