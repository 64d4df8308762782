package optim

import (
	"fmt"
	"strings"

	"github.com/gotron/gotron/tensor"
)

// Param is one trainable tensor. Data and Grad are the model's tensors
// (contiguous float32, on one device — the CPU or an accelerator); the
// optimizer updates Data in place from Grad through the backend's list ops
// and never reallocates either, and keeps its own state on the same device.
// Optimizers and Grads hold the tensors, so the model must not give a
// parameter new storage or a new Grad tensor (or change a group's Params)
// after building them.
type Param struct {
	// Name is the parameter's path, e.g. "decoder.layers.0.mlp.linear_fc1.bias".
	// It keys the optimizer state in checkpoints, so it must be unique.
	Name string
	// Data holds the values; Grad the gradient of the loss (same number of
	// elements, same device). Their shapes may differ (a gradient may be a
	// flat view); Data's shape is the parameter's.
	Data, Grad *tensor.Tensor
	// NoWeightDecay puts the param in the no-decay group (Megatron wd_mult 0).
	// Set it with DefaultNoWeightDecay(Name, Data.Shape()) to follow Megatron.
	NoWeightDecay bool
	// Dims is the whole parameter's number of dimensions (Data may be a
	// flat piece of it): muP's grouping tells matrices from vectors by it.
	Dims int
}

// DefaultNoWeightDecay reports whether Megatron's classic rule
// (get_standard_config_overrides: ParamKey(name="*.bias", predicate=len(shape)==1))
// exempts a parameter from weight decay: every 1-D parameter (norm weights,
// biases) and every parameter whose name ends in ".bias".
func DefaultNoWeightDecay(name string, shape []int) bool {
	return len(shape) == 1 || strings.HasSuffix(name, ".bias")
}

// ApplyWDToQKLayerNorm is Megatron's --apply-wd-to-qk-layernorm rule
// (get_standard_config_overrides' "s1_not_qkln" predicate: 1-D or ".bias"
// parameters skip weight decay unless their name contains "q_layernorm."
// or "k_layernorm."): it puts the query and key layer norms' weights (and
// LayerNorm biases) back into the decay group. Every other parameter keeps
// its NoWeightDecay. It returns how many parameters it moved.
func ApplyWDToQKLayerNorm(params []*Param) int {
	moved := 0
	for _, p := range params {
		if p.NoWeightDecay && (strings.Contains(p.Name, "q_layernorm.") || strings.Contains(p.Name, "k_layernorm.")) {
			p.NoWeightDecay = false
			moved++
		}
	}
	return moved
}

// Group mirrors one Megatron optimizer param group: parameters that share a
// learning rate and weight decay. Scheduler.Apply writes LR and WD before each
// optimizer step, as Megatron's OptimizerParamScheduler.step does.
type Group struct {
	// Name labels the group in errors ("decay", "no_decay", ...).
	Name string
	// Params are the group's parameters.
	Params []*Param
	// WDMult multiplies the scheduled weight decay (Megatron wd_mult). The
	// zero value means no weight decay; DefaultGroups sets 1 for the decay group.
	WDMult float64
	// OverrideLR makes the scheduler use MaxLR/MinLR for this group instead of
	// its own --lr/--min-lr (Megatron's per-group max_lr/min_lr, used by
	// --decoupled-lr for embedding and output weights). False: scheduler values.
	OverrideLR bool
	// MaxLR and MinLR are the group's peak and floor learning rates when
	// OverrideLR is set.
	MaxLR, MinLR float64
	// Eps, when > 0, replaces AdamW's --adam-eps for this group (muP's
	// per-group eps); SGD has none.
	Eps float64
	// LR and WD are the learning rate and (already multiplied) weight decay the
	// next optimizer step uses. Scheduler.Apply sets them; callers not using a
	// Scheduler may set them directly.
	LR, WD float64
}

// DefaultGroups splits params into Megatron's two standard groups: "decay"
// (WDMult 1) with every param whose NoWeightDecay is false, then "no_decay"
// (WDMult 0). Empty groups are kept so the layout never depends on the model.
func DefaultGroups(params []*Param) []Group {
	decay := Group{Name: "decay", WDMult: 1}
	noDecay := Group{Name: "no_decay", WDMult: 0}
	for _, p := range params {
		if p.NoWeightDecay {
			noDecay.Params = append(noDecay.Params, p)
		} else {
			decay.Params = append(decay.Params, p)
		}
	}
	return []Group{decay, noDecay}
}

// flat is the concatenation of every group's params in one order, the order
// of the tensor lists the optimizer ops take (a backend splits their joint
// index space, so chunking does not depend on how the model is split into
// tensors).
type flat struct {
	params []*Param
	group  []int // group index of params[i]
}

// newFlat checks the groups (non-nil params, Data and Grad of equal size on
// one device, unique names) and builds the flat index. who names the caller
// in errors.
func newFlat(who string, groups []Group) (flat, error) {
	var f flat
	seen := map[string]bool{}
	for gi := range groups {
		for _, p := range groups[gi].Params {
			if p == nil {
				return flat{}, fmt.Errorf("optim: %s: group %q holds a nil *Param", who, groups[gi].Name)
			}
			if seen[p.Name] {
				return flat{}, fmt.Errorf("optim: %s: parameter %q appears twice (names key the optimizer state)", who, p.Name)
			}
			seen[p.Name] = true
			if p.Data == nil || p.Grad == nil {
				return flat{}, fmt.Errorf("optim: %s: parameter %q has no Data or no Grad tensor", who, p.Name)
			}
			if p.Grad.Numel() != p.Data.Numel() {
				return flat{}, fmt.Errorf("optim: %s: parameter %q: Grad has %d elements, want Data's %d", who, p.Name, p.Grad.Numel(), p.Data.Numel())
			}
			if p.Grad.Device() != p.Data.Device() {
				return flat{}, fmt.Errorf("optim: %s: parameter %q: Data on the %v device, Grad on %v", who, p.Name, p.Data.Device(), p.Grad.Device())
			}
			f.params = append(f.params, p)
			f.group = append(f.group, gi)
		}
	}
	return f, nil
}

// lists returns the params' Data and Grad as tensor lists (in flat order),
// the form the tensor package's optimizer ops take. who names the caller in
// errors.
func (f *flat) lists(who string) (data, grad *tensor.TensorList, err error) {
	ds, gs := make([]*tensor.Tensor, len(f.params)), make([]*tensor.Tensor, len(f.params))
	for i, p := range f.params {
		ds[i], gs[i] = p.Data, p.Grad
	}
	if data, err = tensor.NewTensorList(ds...); err != nil {
		return nil, nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	if grad, err = tensor.NewTensorList(gs...); err != nil {
		return nil, nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	return data, grad, nil
}

// buffers allocates one zeroed optimizer buffer per param, on the param's
// device and of its shape (tensor.ZerosLike), named for the state kind, and
// returns them with their tensor list.
func (f *flat) buffers(who, kind string) ([]*tensor.Tensor, *tensor.TensorList, error) {
	bufs := make([]*tensor.Tensor, len(f.params))
	for i, p := range f.params {
		bufs[i] = tensor.ZerosLike(p.Data)
		bufs[i].Name = stateKey(kind, p.Name)
	}
	l, err := tensor.NewTensorList(bufs...)
	if err != nil {
		return nil, nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	return bufs, l, nil
}
