package optim

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// AdamWConfig holds AdamW's fixed hyperparameters (the learning rate and
// weight decay come from each Group every step). Zero fields take Megatron's
// defaults, so AdamWConfig{} is --adam-beta1 0.9 --adam-beta2 0.999
// --adam-eps 1e-8. (A β of exactly 0 cannot be expressed; use e.g. 1e-30.)
type AdamWConfig struct {
	// Beta1 is --adam-beta1, the first-moment decay; 0 means 0.9.
	Beta1 float64
	// Beta2 is --adam-beta2, the second-moment decay; 0 means 0.999.
	Beta2 float64
	// Eps is --adam-eps, added to √v̂ (outside the root); 0 means 1e-8.
	Eps float64
}

// withDefaults fills zero fields with Megatron's defaults.
func (c AdamWConfig) withDefaults() AdamWConfig {
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.999
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	return c
}

// Validate reports a hyperparameter outside its range, naming the flag.
func (c AdamWConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case !(c.Beta1 > 0 && c.Beta1 < 1):
		return fmt.Errorf("optim: --adam-beta1 %v: want 0 < beta1 < 1", c.Beta1)
	case !(c.Beta2 > 0 && c.Beta2 < 1):
		return fmt.Errorf("optim: --adam-beta2 %v: want 0 < beta2 < 1", c.Beta2)
	case !(c.Eps > 0) || math.IsInf(c.Eps, 0):
		return fmt.Errorf("optim: --adam-eps %v: want a positive finite value", c.Eps)
	}
	return nil
}

// AdamW is Adam with decoupled weight decay, computed as Megatron's default
// optimizer does it: Transformer Engine / Apex FusedAdam with adam_w_mode
// (csrc/multi_tensor_adam.cu, ADAM_MODE_1), all arithmetic in float32:
//
//	m ← β1·m + (1−β1)·g
//	v ← β2·v + (1−β2)·g²
//	m̂ = m/bc1, v̂ = v/bc2, bc_i = 1 − β_iᵗ (computed in float64 from float32 β, then rounded)
//	p ← p − lr·(m̂/(√v̂ + eps) + wd·p)
//
// torch.optim.AdamW computes p·(1 − lr·wd) − lr/bc1 · m/(√v/√bc2 + eps): the
// same formula with the eps placement identical, differing only in rounding
// (≤ a few float32 ulps per step); the tests check both.
type AdamW struct {
	cfg    AdamWConfig
	groups []Group
	f      flat
	m, v   []*tensor.Tensor // exp_avg, exp_avg_sq per flat param, on its device
	steps  int64

	// The same tensors as lists for tensor.AdamW: params, grads, exp_avg,
	// exp_avg_sq.
	pl, gl, ml, vl *tensor.TensorList
	// coef holds each param's float32 scalars for this step (its group's).
	coef []tensor.AdamWCoeffs
}

var _ Optimizer = (*AdamW)(nil)

// NewAdamW builds an AdamW over groups (see DefaultGroups), allocating zeroed
// exp_avg and exp_avg_sq buffers on each parameter's device. It errors on
// bad hyperparameters, nil or duplicate params and Data/Grad size or device
// mismatches, naming the param.
func NewAdamW(groups []Group, cfg AdamWConfig) (*AdamW, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f, err := newFlat("adamw", groups)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	o := &AdamW{cfg: cfg, groups: groups, f: f, coef: make([]tensor.AdamWCoeffs, len(f.params))}
	if o.pl, o.gl, err = f.lists("adamw"); err != nil {
		return nil, err
	}
	if o.m, o.ml, err = f.buffers("adamw", "exp_avg"); err != nil {
		return nil, err
	}
	if o.v, o.vl, err = f.buffers("adamw", "exp_avg_sq"); err != nil {
		return nil, err
	}
	return o, nil
}

// Groups returns the param groups (aliasing the optimizer's own).
func (o *AdamW) Groups() []Group { return o.groups }

// Steps returns the number of updates applied so far.
func (o *AdamW) Steps() int64 { return o.steps }

// Step applies one AdamW update using each group's LR and WD through
// tensor.AdamW (which the backend splits over all parameters at once). It
// allocates nothing.
func (o *AdamW) Step() {
	o.steps++
	b1, b2 := float32(o.cfg.Beta1), float32(o.cfg.Beta2)
	c := tensor.AdamWCoeffs{Beta1: b1, Beta2: b2, Eps: float32(o.cfg.Eps),
		OneMinusBeta1: 1 - b1, OneMinusBeta2: 1 - b2, // float32 arithmetic, as the CUDA kernel does
		// Apex: bias_correction = 1 - std::pow(beta (float), step) in double, stored as float.
		BC1: float32(1 - math.Pow(float64(b1), float64(o.steps))),
		BC2: float32(1 - math.Pow(float64(b2), float64(o.steps)))}
	for i, gi := range o.f.group {
		g := &o.groups[gi]
		c.LR, c.WD, c.Eps = float32(g.LR), float32(g.WD), float32(o.cfg.Eps)
		if g.Eps > 0 {
			c.Eps = float32(g.Eps)
		}
		o.coef[i] = c
	}
	// The Apex arithmetic above in float32 with each product rounded (no
	// FMA): the same bits on every backend and instruction set.
	tensor.AdamW(o.pl, o.gl, o.ml, o.vl, o.coef)
}

// State returns a copy of the step count and the exp_avg / exp_avg_sq
// buffers ("exp_avg/<name>", "exp_avg_sq/<name>", torch's names), copied to
// the host (a checkpoint boundary).
func (o *AdamW) State() State {
	s := State{Kind: "adamw", Steps: o.steps, Buffers: map[string][]float32{}}
	saveBuffers(s.Buffers, "exp_avg", &o.f, o.m)
	saveBuffers(s.Buffers, "exp_avg_sq", &o.f, o.v)
	return s
}

// StateView implements StateViewer (on a device, the buffers are host
// copies).
func (o *AdamW) StateView() State {
	s := State{Kind: "adamw", Steps: o.steps, Buffers: map[string][]float32{}}
	viewBuffers(s.Buffers, "exp_avg", &o.f, o.m)
	viewBuffers(s.Buffers, "exp_avg_sq", &o.f, o.v)
	return s
}

// LoadState restores s, checking the kind, step count and every buffer's
// presence and length; on error the optimizer is unchanged.
func (o *AdamW) LoadState(s State) error {
	if s.Kind != "adamw" {
		return fmt.Errorf("optim: adamw: load state: state is for optimizer %q, want \"adamw\"", s.Kind)
	}
	if s.Steps < 0 {
		return fmt.Errorf("optim: adamw: load state: negative step count %d", s.Steps)
	}
	if err := checkBuffers("adamw", s, &o.f, []string{"exp_avg", "exp_avg_sq"}); err != nil {
		return err
	}
	loadBuffers(s, "exp_avg", &o.f, o.m)
	loadBuffers(s, "exp_avg_sq", &o.f, o.v)
	o.steps = s.Steps
	return nil
}
