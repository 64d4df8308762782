package optim

import (
	"fmt"
	"strings"

	"github.com/gotron/gotron/tensor"
)

// Param is one trainable tensor. Data and Grad alias the model's storage
// (row-major, len = product of Shape); the optimizer updates Data in place
// from Grad and never reallocates either. Optimizers and Grads hold the
// *Param, so the model must not reallocate Data or Grad (or change a
// group's Params) after building them.
type Param struct {
	// Name is the parameter's path, e.g. "decoder.layers.0.mlp.linear_fc1.bias".
	// It keys the optimizer state in checkpoints, so it must be unique.
	Name string
	// Data holds the values; Grad the gradient of the loss (same length).
	Data, Grad []float32
	// Shape is the logical shape; only its rank matters here (1-D params get
	// no weight decay under DefaultNoWeightDecay).
	Shape []int
	// NoWeightDecay puts the param in the no-decay group (Megatron wd_mult 0).
	// Set it with DefaultNoWeightDecay(Name, Shape) to follow Megatron.
	NoWeightDecay bool
}

// DefaultNoWeightDecay reports whether Megatron's classic rule
// (get_standard_config_overrides: ParamKey(name="*.bias", predicate=len(shape)==1))
// exempts a parameter from weight decay: every 1-D parameter (norm weights,
// biases) and every parameter whose name ends in ".bias".
func DefaultNoWeightDecay(name string, shape []int) bool {
	return len(shape) == 1 || strings.HasSuffix(name, ".bias")
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

// newFlat checks the groups (non-nil params, Data and Grad of equal length,
// Shape consistent, unique names) and builds the flat index. who names the
// caller in errors.
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
			if len(p.Grad) != len(p.Data) {
				return flat{}, fmt.Errorf("optim: %s: parameter %q: len(Grad)=%d, want len(Data)=%d", who, p.Name, len(p.Grad), len(p.Data))
			}
			if p.Shape != nil {
				n := 1
				for _, d := range p.Shape {
					n *= d
				}
				if n != len(p.Data) {
					return flat{}, fmt.Errorf("optim: %s: parameter %q: shape %v holds %d values, len(Data)=%d", who, p.Name, p.Shape, n, len(p.Data))
				}
			}
			f.params = append(f.params, p)
			f.group = append(f.group, gi)
		}
	}
	return f, nil
}

// lists returns the params' Data and Grad as tensor lists (aliasing them,
// in flat order), the form the tensor package's optimizer ops take. who
// names the caller in errors.
func (f *flat) lists(who string) (data, grad *tensor.TensorList, err error) {
	ds, gs := make([]*tensor.Tensor, len(f.params)), make([]*tensor.Tensor, len(f.params))
	for i, p := range f.params {
		ds[i] = tensor.FromFloat32(p.Data, len(p.Data))
		ds[i].Name = p.Name
		gs[i] = tensor.FromFloat32(p.Grad, len(p.Grad))
		gs[i].Name = p.Name + ".grad"
	}
	if data, err = tensor.NewTensorList(ds...); err != nil {
		return nil, nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	if grad, err = tensor.NewTensorList(gs...); err != nil {
		return nil, nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	return data, grad, nil
}

// bufferList returns the optimizer buffers bufs (one per param, in flat
// order) as a tensor list aliasing them; kind names them in errors.
func (f *flat) bufferList(who, kind string, bufs [][]float32) (*tensor.TensorList, error) {
	ts := make([]*tensor.Tensor, len(bufs))
	for i, b := range bufs {
		ts[i] = tensor.FromFloat32(b, len(b))
		ts[i].Name = stateKey(kind, f.params[i].Name)
	}
	l, err := tensor.NewTensorList(ts...)
	if err != nil {
		return nil, fmt.Errorf("optim: %s: %w", who, err)
	}
	return l, nil
}
