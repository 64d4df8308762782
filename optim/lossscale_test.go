package optim

import (
	"math"
	"strings"
	"testing"
)

// TestDynamicLossScaler walks Megatron's DynamicGradScaler rules: hysteresis
// overflows before backing off, back-off on every further overflow until a
// clean window, growth after Window clean iterations, the minimum scale.
func TestDynamicLossScaler(t *testing.T) {
	s, err := NewLossScaler(LossScalerConfig{Window: 4})
	if err != nil {
		t.Fatal(err)
	}
	if s.Scale() != 1<<32 || s.InvScale() != float32(math.Ldexp(1, -32)) {
		t.Fatalf("defaults: scale %v inv %v", s.Scale(), s.InvScale())
	}
	type ev struct {
		inf   bool
		scale float32
		rule  string
	}
	seq := []ev{
		{true, 1 << 32, "first overflow is absorbed by hysteresis 2"},
		{true, 1 << 31, "second consecutive overflow halves the scale"},
		{true, 1 << 30, "hysteresis stays spent: every overflow halves"},
		{false, 1 << 30, "clean 1"},
		{false, 1 << 30, "clean 2"},
		{false, 1 << 30, "clean 3"},
		{false, 1 << 31, "4th clean iteration in a row doubles"},
		{true, 1 << 31, "hysteresis restored by growth"},
		{false, 1 << 31, "clean resets nothing but growth tracker counts from 0"},
		{true, 1 << 30, "hysteresis was not restored by one clean step"},
	}
	for i, e := range seq {
		s.Update(e.inf)
		if s.Scale() != e.scale {
			t.Fatalf("event %d (%s): scale %v, want %v", i, e.rule, s.Scale(), e.scale)
		}
	}
	st := s.State()
	if st.Scale != 1<<30 || st.GrowthTracker != 0 || st.HysteresisTracker != 0 {
		t.Errorf("State() = %+v", st)
	}
	r, _ := NewLossScaler(LossScalerConfig{Window: 4})
	if err := r.LoadState(st); err != nil || r.State() != st {
		t.Errorf("LoadState round trip: %v %+v", err, r.State())
	}
	if err := r.LoadState(LossScalerState{Scale: 0}); err == nil {
		t.Error("LoadState(scale 0): no error")
	}

	m, _ := NewLossScaler(LossScalerConfig{InitialScale: 4, MinScale: 2, Hysteresis: 1})
	for i := 0; i < 5; i++ {
		m.Update(true)
	}
	if m.Scale() != 2 {
		t.Errorf("scale fell to %v, below --min-loss-scale 2", m.Scale())
	}

	c, _ := NewLossScaler(LossScalerConfig{Constant: 1024})
	for i := 0; i < 3; i++ {
		c.Update(true)
	}
	if c.Scale() != 1024 || c.InvScale() != 1.0/1024 {
		t.Errorf("constant scaler moved: %v", c.Scale())
	}

	for _, bad := range []struct {
		cfg  LossScalerConfig
		want string
	}{
		{LossScalerConfig{Constant: -1}, "--loss-scale"},
		{LossScalerConfig{InitialScale: 1, MinScale: 2}, "--min-loss-scale 2"},
		{LossScalerConfig{Window: -1}, "--loss-scale-window"},
		{LossScalerConfig{Hysteresis: -3}, "--hysteresis"},
		{LossScalerConfig{InitialScale: 1e39}, "--initial-loss-scale"},
	} {
		if _, err := NewLossScaler(bad.cfg); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("NewLossScaler(%+v) = %v, want error naming %s", bad.cfg, err, bad.want)
		}
	}
}

// TestGradsUnscale checks that Unscale multiplies by the inverse scale and
// reports non-finite gradients.
func TestGradsUnscale(t *testing.T) {
	ps := testParams(10, false)
	fillGrads(ps, 6)
	orig := clone(ps)
	g, _ := NewGrads(ps)
	if g.Unscale(0.25) {
		t.Fatal("Unscale reported overflow on finite grads")
	}
	for k := range ps {
		for i := range ps[k].Grad.Float32s() {
			if ps[k].Grad.Float32s()[i] != orig[k].Grad.Float32s()[i]*0.25 {
				t.Fatalf("%s[%d] = %v, want %v/4", ps[k].Name, i, ps[k].Grad.Float32s()[i], orig[k].Grad.Float32s()[i])
			}
		}
	}
	ps[2].Grad.Float32s()[3] = float32(math.Inf(1))
	if !g.Unscale(0.5) {
		t.Error("Unscale missed +Inf")
	}
}
