package infer

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// WeightLayout chooses how decode steps read the linear weights
// (--decode-weights).
type WeightLayout int

const (
	// WeightsPacked (the zero value) packs every linear weight once, at
	// NewEngine, into the GEMM micro-kernels' strips: a decode step then
	// streams each weight from memory in order instead of repacking the
	// model's (out, in) layout on every call. A second copy of the linear
	// weights (in float32, or half of it in bfloat16).
	WeightsPacked WeightLayout = iota
	// WeightsModel uses the model's weights through the general GEMM: a
	// lone sequence then decodes with gotron generate's arithmetic exactly
	// on every CPU (packed float32 weights give the same bits except on
	// AVX-512, whose one-to-three-row products take a dot-product path).
	WeightsModel
)

// ParseWeightLayout reads "packed" or "model".
func ParseWeightLayout(s string) (WeightLayout, error) {
	switch s {
	case "packed", "":
		return WeightsPacked, nil
	case "model":
		return WeightsModel, nil
	case "auto", "transposed":
		return 0, fmt.Errorf("infer: weight layout %q was replaced by \"packed\" (weights packed once for the GEMM kernels, faster at every batch size): want packed or model", s)
	}
	return 0, fmt.Errorf("infer: weight layout %q: want packed or model", s)
}

// String returns the layout's name.
func (l WeightLayout) String() string {
	if l == WeightsModel {
		return "model"
	}
	return "packed"
}

// PackedLinears holds a model's linear weights (QKV, projection, MLP,
// output layer) prepared by the backend for repeated products
// (tensor.PackWeight). It implements gpt.Linears.
type PackedLinears struct {
	w     map[*tensor.Tensor]*tensor.PackedWeight
	bytes int64
}

// PackLinears packs every linear weight of m, stored in dtype
// (tensor.Float32 or tensor.BFloat16). With tensor.BFloat16 the weights
// are rounded to bfloat16 (to nearest even); round the model first
// (gpt.Model.RoundToBF16) for every op to see the same weights, as `--bf16`
// does.
func PackLinears(m *gpt.Model, dtype tensor.DType) *PackedLinears {
	pl := &PackedLinears{w: map[*tensor.Tensor]*tensor.PackedWeight{}}
	add := func(w *tensor.Tensor) {
		if w == nil || pl.w[w] != nil {
			return
		}
		pw := tensor.PackWeight(w, dtype)
		pl.w[w] = pw
		pl.bytes += pw.Bytes()
	}
	for i := range m.Layers {
		for _, w := range packedWeights(m, &m.Layers[i]) {
			add(w)
		}
	}
	switch {
	case m.FinalNorm == nil: // a pipeline stage before the last: no head
	case m.OutputLayer != nil:
		add(m.OutputLayer)
	default:
		add(m.WordEmb)
	}
	return pl
}

// packedWeights are the layer's weights PackLinears packs (nil where the
// layer has none): attention's projections (fused QKV, or multi-latent
// attention's down- and up-projections), the MLP's, and an MoE layer's
// router and shared expert, linear layers of every token. The routed
// experts run as one grouped GEMM over the step's tokens
// (tensor.Tape.GroupedLinear) on the model's weights. With cached MLA
// latents the key-value up-projection is no linear layer (its halves
// multiply the queries and the outputs per head, on the model's weight):
// not packed.
func packedWeights(m *gpt.Model, l *gpt.Layer) []*tensor.Tensor {
	kvUp := l.KVUp
	if m.CacheMLALatents {
		kvUp = nil
	}
	ws := []*tensor.Tensor{l.QKV, l.QProj, l.QDown, l.QUp, l.KVDown, kvUp, l.Proj, l.FC1, l.FC2}
	if moe := l.MoE; moe != nil {
		ws = append(ws, moe.Router, moe.SharedFC1, moe.SharedFC2, moe.Gate)
	}
	return ws
}

// PackedBytes estimates the memory NewEngine(m, cfg) allocates for packed
// weights (0 with WeightsModel): every linear weight in float32 or, with
// cfg.BF16, bfloat16 (strip padding aside).
func PackedBytes(m *gpt.Model, cfg EngineConfig) int64 {
	if cfg.Weights == WeightsModel {
		return 0
	}
	var n int64
	for i := range m.Layers {
		for _, w := range packedWeights(m, &m.Layers[i]) {
			if w != nil {
				n += int64(w.Numel())
			}
		}
	}
	switch {
	case m.FinalNorm == nil: // a pipeline stage before the last: no head
	case m.OutputLayer != nil:
		n += int64(m.OutputLayer.Numel())
	default:
		n += int64(m.WordEmb.Numel())
	}
	if cfg.BF16 {
		return 2 * n
	}
	return 4 * n
}

// Bytes returns the memory the packed weights take.
func (pl *PackedLinears) Bytes() int64 { return pl.bytes }

// Linear is tp.Linear(x, w, b) (x·wᵀ + b) through w's packed copy
// (tp.LinearPacked); a weight without one goes through tp.Linear. No
// gradients are recorded: decoding only.
func (pl *PackedLinears) Linear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	pw := pl.w[w]
	if pw == nil {
		return tp.Linear(x, w, b)
	}
	if x.Dim(-1) != pw.In() {
		panic(fmt.Sprintf("infer: linear input %v does not match weight %v", x.Shape(), w.Shape()))
	}
	return tp.LinearPacked(x, pw, b)
}
