package gpt

import (
	"fmt"
	"sync"

	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/tensor"
)

// FP8Config is Megatron's FP8 setting (--fp8-format, --fp8-recipe and the
// delayed recipe's flags, --fp8-param-gather, --first-last-layers-bf16):
// the linear layers Transformer Engine builds — QKV, the attention output
// projection, fc1 and fc2 — multiply FP8 operands (tensor.LinearFP8); the
// attention core, the norms, the embedding and the output layer do not, as
// in Megatron (TE's fp8_autocast covers TE's Linear modules; the output
// layer is a plain column-parallel linear).
type FP8Config struct {
	Recipe fp8.Recipe
	// ParamGather (--fp8-param-gather) keeps the model's compute weights
	// in FP8, quantized from the float32 main parameters after each step
	// (TE's fp8_model_init; Megatron all-gathers them in FP8). In gotron's
	// single-copy parameters that is: a weight is quantized straight from
	// the float32 parameter, never rounded to bfloat16 first. Without it,
	// under --bf16 the weight is Megatron's bfloat16 model weight,
	// quantized at the product (a double rounding, float32 → bfloat16 →
	// FP8). Without --bf16 both are the same numbers.
	ParamGather bool
	// BF16LayersAtStart and BF16LayersAtEnd (--first-last-layers-bf16 with
	// --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16; 0
	// without it) are the layers (global indices) that stay out of FP8, as
	// Megatron's is_first_last_bf16_layer.
	BF16LayersAtStart, BF16LayersAtEnd int
}

// Validate checks c against the model.
func (c FP8Config) Validate(m Config) error {
	if err := c.Recipe.Validate(); err != nil {
		return err
	}
	if c.BF16LayersAtStart < 0 || c.BF16LayersAtEnd < 0 {
		return fmt.Errorf("gpt: --num-layers-at-start-in-bf16 %d / --num-layers-at-end-in-bf16 %d: want >= 0", c.BF16LayersAtStart, c.BF16LayersAtEnd)
	}
	if c.Recipe.Kind == fp8.Delayed && (c.BF16LayersAtStart > 0 || c.BF16LayersAtEnd > 0) {
		return fmt.Errorf("gpt: --first-last-layers-bf16 with --fp8-recipe delayed: Megatron refuses it (\"Delayed scaling does not support first / last layer in BF16.\")")
	}
	switch {
	case m.MoE.NumExperts > 0:
		return fmt.Errorf("gpt: FP8 with mixture of experts (--num-experts): gotron's FP8 covers dense layers only (TE's grouped expert GEMMs are not built)")
	case m.MLA.Enabled:
		return fmt.Errorf("gpt: FP8 with --multi-latent-attention: gotron's FP8 covers standard attention's QKV and projection only")
	case m.GDN.Enabled:
		return fmt.Errorf("gpt: FP8 with gated delta net layers: gotron's FP8 covers attention and MLP layers only")
	}
	return nil
}

// FP8 is a model's FP8 state (Model.FP8): the configuration and, per
// linear layer (by weight), the delayed recipe's amax histories. One FP8
// may serve the models and stages of one rank.
type FP8 struct {
	Config FP8Config
	// BF16 (--bf16): activations and gradients are quantized from their
	// bfloat16 roundings, and weights too unless ParamGather.
	BF16 bool
	// CacheWeights (decoding: weights that never change) keeps each
	// weight's quantization from its first product (tensor.FP8Linear's
	// CacheWeight): a float32 copy of every FP8 weight.
	CacheWeights bool

	mu      sync.Mutex
	linears map[*tensor.Tensor]*tensor.FP8Linear
	order   []*tensor.FP8Linear // creation order, for the updates
	weights []*tensor.Tensor    // order's weights
	// saved is delayed-scaling state from a checkpoint (RestoreDelayed)
	// by weight name, given to each linear layer when it is made.
	saved map[string][]float32
}

// DelayedState returns, by weight name, the delayed recipe's state of
// every linear layer made so far (nil under another recipe): its input's,
// weight's and output gradient's amax histories and scales, laid out as
// [input history…, input scale, weight history…, weight scale, gradient
// history…, gradient scale] (3·(AmaxHistoryLen+1) values). Under the amax
// reduction group every rank of it holds the same.
func (f *FP8) DelayedState() map[string][]float32 {
	if f == nil || f.Config.Recipe.Kind != fp8.Delayed {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tensor.FoldFP8DeviceAmaxes(f.order) // the GPU's amaxes since the last update
	out := make(map[string][]float32, len(f.order))
	for i, l := range f.order {
		var v []float32
		for _, h := range []*fp8.History{l.Input, l.Weight, l.Grad} {
			v = append(append(v, h.Amaxes()...), h.Scale())
		}
		out[f.weights[i].Name] = v
	}
	return out
}

// DelayedStateLen is the length of one linear layer's DelayedState.
func (f *FP8) DelayedStateLen() int { return 3 * (f.Config.Recipe.AmaxHistoryLen + 1) }

// RestoreDelayed gives the linear layers the saved delayed-scaling state
// (DelayedState's layout, by weight name): those made already at once,
// the others when they are made. A vector of the wrong length is an
// error naming the weight.
func (f *FP8) RestoreDelayed(saved map[string][]float32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.Config.Recipe.AmaxHistoryLen
	for name, v := range saved {
		if len(v) != f.DelayedStateLen() {
			return fmt.Errorf("gpt: FP8 delayed-scaling state of %s: %d values, want %d (3 × (--fp8-amax-history-len %d + 1))", name, len(v), f.DelayedStateLen(), n)
		}
		scratch := fp8.NewHistory(n)
		for k := range 3 {
			part := v[k*(n+1) : (k+1)*(n+1)]
			if err := scratch.Restore(part[:n], part[n]); err != nil {
				return fmt.Errorf("gpt: FP8 delayed-scaling state of %s (%s): %w", name, [3]string{"input", "weight", "output gradient"}[k], err)
			}
		}
	}
	f.saved = saved
	for i, l := range f.order {
		f.restore(f.weights[i].Name, l)
	}
	return nil
}

// restore sets l's histories from f.saved[name], if any (f.mu held; the
// values were checked by RestoreDelayed, so Restore cannot fail).
func (f *FP8) restore(name string, l *tensor.FP8Linear) {
	v, ok := f.saved[name]
	if !ok {
		return
	}
	n := f.Config.Recipe.AmaxHistoryLen
	for k, h := range []*fp8.History{l.Input, l.Weight, l.Grad} {
		part := v[k*(n+1) : (k+1)*(n+1)]
		_ = h.Restore(part[:n], part[n])
	}
}

// NewFP8 returns the FP8 state of a run.
func NewFP8(c FP8Config, bf16 bool) *FP8 {
	return &FP8{Config: c, BF16: bf16, linears: map[*tensor.Tensor]*tensor.FP8Linear{}}
}

// InFP8 reports whether layer (a global index) of a model of n layers
// runs its linear layers in FP8 (Megatron's is_first_last_bf16_layer).
func (f *FP8) InFP8(layer, n int) bool {
	return layer >= f.Config.BF16LayersAtStart && layer < n-f.Config.BF16LayersAtEnd
}

// linear returns weight w's state, made at its first use.
func (f *FP8) linear(w *tensor.Tensor) *tensor.FP8Linear {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.linears[w]
	if !ok {
		l = tensor.NewFP8Linear(f.Config.Recipe, f.BF16, f.BF16 && !f.Config.ParamGather)
		l.CacheWeight = f.CacheWeights
		f.restore(w.Name, l)
		f.linears[w] = l
		f.order = append(f.order, l)
		f.weights = append(f.weights, w)
	}
	return l
}

// Linears returns the linear layers' states in the order of their first
// use (the same on every rank of a tensor/data/context-parallel group).
func (f *FP8) Linears() []*tensor.FP8Linear {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*tensor.FP8Linear(nil), f.order...)
}

// EndForward ends a forward pass (TE's fp8_autocast exit): under the
// delayed recipe the amaxes recorded since the last update into the
// input and weight histories of the linear layers that ran are reduced (reduce replaces
// them by their maximum over the amax reduction group; nil: one rank), then
// the histories update their scales. Nothing under tensorwise.
func (f *FP8) EndForward(reduce func([]float32) error) error {
	return f.update(reduce, false)
}

// EndBackward ends a backward pass: the same for the output gradients'
// histories (TE's reduce_and_update_fp8_tensors(forward=False) once the
// region's backward is done).
func (f *FP8) EndBackward(reduce func([]float32) error) error {
	return f.update(reduce, true)
}

func (f *FP8) update(reduce func([]float32) error, backward bool) error {
	if f == nil || f.Config.Recipe.Kind != fp8.Delayed {
		return nil
	}
	r := f.Config.Recipe
	f.mu.Lock()
	defer f.mu.Unlock()
	// on the GPU the amaxes are on the device until now (tensor's
	// cuda_fp8.go): one read-back for every layer
	tensor.FoldFP8DeviceAmaxes(f.order)
	// the tensors quantized since the last update: a pipeline rank's
	// other model chunks, which did not run, keep theirs
	var hs []*fp8.History
	for _, l := range f.order {
		for _, h := range []*fp8.History{l.Input, l.Weight, l.Grad} {
			if (h == l.Grad) == backward && h.Observed() {
				hs = append(hs, h)
			}
		}
	}
	if reduce != nil && len(hs) > 0 {
		amax := make([]float32, len(hs))
		for i, h := range hs {
			amax[i] = h.Current()
		}
		if err := reduce(amax); err != nil {
			return fmt.Errorf("gpt: FP8 amax reduction: %w", err)
		}
		for i, h := range hs {
			h.SetCurrent(amax[i])
		}
	}
	format := r.ForwardFormat()
	if backward {
		format = r.GradFormat()
	}
	for _, h := range hs {
		h.Update(format, r.Margin, r.AmaxAlgo)
	}
	return nil
}

// fp8Linears is the Linears of a layer in FP8: tensor.Tape.LinearFP8 with
// the weight's state.
type fp8Linears struct{ f *FP8 }

func (l fp8Linears) Linear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	return tp.LinearFP8(x, w, b, l.f.linear(w))
}

// layerPass returns the pass a layer runs with: p, or under FP8 (a layer
// not kept in bf16) a copy whose linear layers multiply FP8 operands
// quantized from the model's weights (a decoding server's packed copies
// are for the other products: the output layer, the bf16 layers).
func (m *Model) layerPass(p *pass, index int) *pass {
	if m.FP8 == nil || !m.FP8.InFP8(index, m.Config.NumLayers) {
		return p
	}
	q := *p
	q.lin = fp8Linears{m.FP8}
	return &q
}
