package optim

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// LossScalerConfig configures fp16 loss scaling
// (megatron/core/optimizer/grad_scaler.py). The zero value is Megatron's
// dynamic default: --initial-loss-scale 2^32, --min-loss-scale 1,
// --loss-scale-window 1000, --hysteresis 2, growth ×2, backoff ×0.5.
type LossScalerConfig struct {
	// Constant is --loss-scale: when > 0 the scale is fixed at this value
	// (ConstantGradScaler) and the fields below are ignored.
	Constant float64
	// InitialScale is --initial-loss-scale; 0 means 2^32.
	InitialScale float64
	// MinScale is --min-loss-scale; 0 means 1.
	MinScale float64
	// Window is --loss-scale-window, clean iterations before the scale
	// doubles; 0 means 1000.
	Window int
	// Hysteresis is --hysteresis, consecutive overflowing iterations before
	// the scale halves; 0 means 2.
	Hysteresis int
}

// LossScaler is Megatron's DynamicGradScaler (or ConstantGradScaler). The
// scale is a float32, as Megatron keeps it in a float tensor. Use:
//
//	loss·Scale() → backward → foundInf := grads.Unscale(s.InvScale())
//	(all-reduce foundInf with MAX) → s.Update(foundInf) → skip the step if foundInf
type LossScaler struct {
	constant                bool
	scale, min              float32
	growth, backoff         float32
	window, hysteresis      int
	growthTracker, hystLeft int
}

// NewLossScaler validates cfg (Megatron's assertions, naming the flags).
func NewLossScaler(cfg LossScalerConfig) (*LossScaler, error) {
	if cfg.Constant < 0 || math.IsNaN(cfg.Constant) || math.IsInf(cfg.Constant, 0) || cfg.Constant > math.MaxFloat32 {
		return nil, fmt.Errorf("optim: --loss-scale %v: want a positive finite float32", cfg.Constant)
	}
	if cfg.Constant > 0 {
		return &LossScaler{constant: true, scale: float32(cfg.Constant)}, nil
	}
	if cfg.InitialScale == 0 {
		cfg.InitialScale = 1 << 32
	}
	if cfg.MinScale == 0 {
		cfg.MinScale = 1
	}
	if cfg.Window == 0 {
		cfg.Window = 1000
	}
	if cfg.Hysteresis == 0 {
		cfg.Hysteresis = 2
	}
	switch {
	case !(cfg.InitialScale > 0) || cfg.InitialScale > math.MaxFloat32:
		return nil, fmt.Errorf("optim: --initial-loss-scale %v: want a positive float32", cfg.InitialScale)
	case !(cfg.MinScale > 0) || cfg.MinScale > cfg.InitialScale:
		return nil, fmt.Errorf("optim: --min-loss-scale %v: want 0 < min <= --initial-loss-scale %v", cfg.MinScale, cfg.InitialScale)
	case cfg.Window < 0:
		return nil, fmt.Errorf("optim: --loss-scale-window %d: want > 0", cfg.Window)
	case cfg.Hysteresis < 0:
		return nil, fmt.Errorf("optim: --hysteresis %d: want > 0", cfg.Hysteresis)
	}
	return &LossScaler{scale: float32(cfg.InitialScale), min: float32(cfg.MinScale), growth: 2, backoff: 0.5,
		window: cfg.Window, hysteresis: cfg.Hysteresis, hystLeft: cfg.Hysteresis}, nil
}

// Scale returns the current loss scale.
func (s *LossScaler) Scale() float32 { return s.scale }

// InvScale returns 1/scale computed in float64 and rounded to float32, as
// Megatron's inv_scale (scale.double().reciprocal().float()).
func (s *LossScaler) InvScale() float32 { return float32(1 / float64(s.scale)) }

// Update records whether this iteration's gradients overflowed: on overflow
// the growth tracker resets and the hysteresis counter drops, and once it
// reaches 0 the scale backs off (×0.5, not below the minimum) on every
// further overflow; after Window clean iterations in a row the scale grows
// ×2 and the hysteresis counter is restored. A constant scaler ignores it.
func (s *LossScaler) Update(foundInf bool) {
	if s.constant {
		return
	}
	if foundInf {
		s.growthTracker = 0
		s.hystLeft--
		if s.hystLeft <= 0 {
			s.scale = max(s.scale*s.backoff, s.min)
		}
		return
	}
	s.growthTracker++
	if s.growthTracker == s.window {
		s.growthTracker = 0
		s.hystLeft = s.hysteresis
		s.scale *= s.growth
	}
}

// LossScalerState is the scaler's checkpoint record (Megatron's keys).
type LossScalerState struct {
	Scale             float32 `json:"scale"`
	GrowthTracker     int     `json:"growth_tracker"`
	HysteresisTracker int     `json:"hysteresis_tracker"`
}

// State returns the checkpoint record (Megatron saves nothing for a
// constant scaler; this returns its scale with zero trackers).
func (s *LossScaler) State() LossScalerState {
	return LossScalerState{Scale: s.scale, GrowthTracker: s.growthTracker, HysteresisTracker: s.hystLeft}
}

// LoadState restores a checkpoint record; a constant scaler ignores it, as
// Megatron's does.
func (s *LossScaler) LoadState(st LossScalerState) error {
	if s.constant {
		return nil
	}
	if !(st.Scale > 0) || math.IsInf(float64(st.Scale), 0) {
		return fmt.Errorf("optim: loss scaler: load state: scale %v: want a positive finite value", st.Scale)
	}
	if st.GrowthTracker < 0 || st.GrowthTracker >= s.window {
		return fmt.Errorf("optim: loss scaler: load state: growth_tracker %d: want 0 <= tracker < --loss-scale-window %d", st.GrowthTracker, s.window)
	}
	s.scale, s.growthTracker, s.hystLeft = st.Scale, st.GrowthTracker, st.HysteresisTracker
	return nil
}

// Unscale multiplies every gradient by inv (LossScaler.InvScale) and reports
// whether any was NaN or ±Inf, like torch._amp_foreach_non_finite_check_and_unscale_
// (which Megatron calls before all-reducing found_inf).
func (g *Grads) Unscale(inv float32) bool {
	tensor.ScaleList(g.grads, inv)
	return g.FoundInf()
}

// UnscaleTo is Unscale leaving the found-inf flag in out (FoundInfTo).
func (g *Grads) UnscaleTo(inv float32, out *tensor.Tensor) {
	tensor.ScaleList(g.grads, inv)
	g.FoundInfTo(out)
}
