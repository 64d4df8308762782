package optim

import (
	"fmt"
	"sort"
	"strings"
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

// flat is the concatenation of every group's params into one index space
// [0, total), so one cpu.Parallel call covers all of them and chunk
// boundaries do not depend on how the model is split into tensors.
type flat struct {
	params []*Param
	group  []int // group index of params[i]
	start  []int // start[i] is params[i]'s first flat index; start[len] = total
}

// newFlat checks the groups (non-nil params, Data and Grad of equal length,
// Shape consistent, unique names) and builds the flat index. who names the
// caller in errors.
func newFlat(who string, groups []Group) (flat, error) {
	var f flat
	seen := map[string]bool{}
	total := 0
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
			f.start = append(f.start, total)
			total += len(p.Data)
		}
	}
	f.start = append(f.start, total)
	return f, nil
}

// total is the number of scalar parameters.
func (f *flat) total() int { return f.start[len(f.start)-1] }

// each calls fn(i, a, b) for every param i overlapping the flat range
// [lo, hi), with [a, b) the overlap in that param's local indices.
func (f *flat) each(lo, hi int, fn func(i, a, b int)) {
	if lo >= hi {
		return
	}
	// First param whose end is > lo.
	i := sort.Search(len(f.params), func(k int) bool { return f.start[k+1] > lo })
	for ; i < len(f.params) && f.start[i] < hi; i++ {
		a := max(lo, f.start[i]) - f.start[i]
		b := min(hi, f.start[i+1]) - f.start[i]
		if a < b {
			fn(i, a, b)
		}
	}
}
