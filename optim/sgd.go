package optim

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// SGDConfig holds SGD's fixed hyperparameters. The zero value is plain SGD
// without momentum; Megatron's --optimizer sgd default is Momentum 0.9
// (--sgd-momentum), which callers set explicitly.
type SGDConfig struct {
	// Momentum is --sgd-momentum; 0 disables the momentum buffer.
	Momentum float64
	// Dampening scales the gradient added to the buffer by (1 − Dampening)
	// (torch.optim.SGD; Megatron uses 0).
	Dampening float64
	// Nesterov uses g + momentum·buf instead of buf (torch semantics).
	Nesterov bool
}

// Validate reports a hyperparameter outside its range, naming the flag.
func (c SGDConfig) Validate() error {
	switch {
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("optim: --sgd-momentum %v: want 0 <= momentum < 1", c.Momentum)
	case !(c.Dampening >= 0 && c.Dampening <= 1):
		return fmt.Errorf("optim: sgd dampening %v: want 0 <= dampening <= 1", c.Dampening)
	case c.Nesterov && (c.Momentum == 0 || c.Dampening != 0):
		return fmt.Errorf("optim: sgd: Nesterov momentum requires momentum > 0 and dampening 0 (torch rule)")
	}
	return nil
}

// SGD is stochastic gradient descent with torch.optim.SGD semantics (also
// Apex FusedSGD's, which Megatron uses), in float32:
//
//	d = g + wd·p                       (coupled L2 weight decay, as torch)
//	buf = d on the first step, else momentum·buf + (1−dampening)·d
//	d = buf, or d + momentum·buf with Nesterov
//	p ← p − lr·d
type SGD struct {
	cfg    SGDConfig
	groups []Group
	f      flat
	buf    []*tensor.Tensor // momentum_buffer per flat param, on its device; nil without momentum
	steps  int64

	// The same tensors as lists for tensor.SGD: params, grads and
	// momentum buffers (nil without momentum).
	pl, gl, bl *tensor.TensorList
	// coef holds each param's float32 scalars for this step.
	coef []tensor.SGDCoeffs
}

var _ Optimizer = (*SGD)(nil)

// NewSGD builds an SGD over groups, with zeroed momentum buffers (on each
// parameter's device) when cfg.Momentum > 0. Errors name the bad flag or parameter.
func NewSGD(groups []Group, cfg SGDConfig) (*SGD, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f, err := newFlat("sgd", groups)
	if err != nil {
		return nil, err
	}
	o := &SGD{cfg: cfg, groups: groups, f: f, coef: make([]tensor.SGDCoeffs, len(f.params))}
	if o.pl, o.gl, err = f.lists("sgd"); err != nil {
		return nil, err
	}
	if cfg.Momentum != 0 {
		if o.buf, o.bl, err = f.buffers("sgd", "momentum_buffer"); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Groups returns the param groups (aliasing the optimizer's own).
func (o *SGD) Groups() []Group { return o.groups }

// Steps returns the number of updates applied so far.
func (o *SGD) Steps() int64 { return o.steps }

// Step applies one SGD update using each group's LR and WD through
// tensor.SGD. It allocates nothing.
func (o *SGD) Step() {
	first := o.steps == 0
	o.steps++
	c := tensor.SGDCoeffs{Momentum: float32(o.cfg.Momentum), OneMinusDampening: float32(1 - o.cfg.Dampening),
		FirstStep: first, Nesterov: o.cfg.Nesterov}
	for i, gi := range o.f.group {
		g := &o.groups[gi]
		c.LR, c.WD = float32(g.LR), float32(g.WD)
		o.coef[i] = c
	}
	tensor.SGD(o.pl, o.gl, o.bl, o.coef)
}

// State returns a copy of the step count and, with momentum, the
// "momentum_buffer/<name>" buffers.
func (o *SGD) State() State {
	s := State{Kind: "sgd", Steps: o.steps, Buffers: map[string][]float32{}}
	if o.buf != nil {
		saveBuffers(s.Buffers, "momentum_buffer", &o.f, o.buf)
	}
	return s
}

// StateView implements StateViewer.
func (o *SGD) StateView() State {
	s := State{Kind: "sgd", Steps: o.steps, Buffers: map[string][]float32{}}
	if o.buf != nil {
		viewBuffers(s.Buffers, "momentum_buffer", &o.f, o.buf)
	}
	return s
}

// LoadState restores s, checking kind, step count and buffers.
func (o *SGD) LoadState(s State) error {
	if s.Kind != "sgd" {
		return fmt.Errorf("optim: sgd: load state: state is for optimizer %q, want \"sgd\"", s.Kind)
	}
	if s.Steps < 0 {
		return fmt.Errorf("optim: sgd: load state: negative step count %d", s.Steps)
	}
	var kinds []string
	if o.buf != nil {
		kinds = []string{"momentum_buffer"}
	}
	if err := checkBuffers("sgd", s, &o.f, kinds); err != nil {
		return err
	}
	if o.buf != nil {
		loadBuffers(s, "momentum_buffer", &o.f, o.buf)
	}
	o.steps = s.Steps
	return nil
}
