package optim

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestOptimizersOnSimMatchCPU: AdamW and SGD over parameters on the
// simulated device keep their state there and give the CPU's parameters bit
// for bit, clipping and loss unscaling included; their state reaches a
// checkpoint, and comes back from one, only through counted host copies, and
// a run resumed from it on either device goes on identically.
func TestOptimizersOnSimMatchCPU(t *testing.T) {
	build := map[string]func([]Group) (Optimizer, error){
		"adamw": func(g []Group) (Optimizer, error) { return NewAdamW(g, AdamWConfig{}) },
		"sgd":   func(g []Group) (Optimizer, error) { return NewSGD(g, SGDConfig{Momentum: 0.9}) },
	}
	toSim := func(ps []*Param) []*Param {
		out := make([]*Param, len(ps))
		for i, p := range ps {
			q := *p
			q.Data, q.Grad = p.Data.ToDevice(tensor.Sim), p.Grad.ToDevice(tensor.Sim)
			out[i] = &q
		}
		return out
	}
	setGrads := func(dst, src []*Param) {
		for i := range dst {
			tensor.Copy(dst[i].Grad, src[i].Grad)
		}
	}
	steps := func(o Optimizer, g *Grads, n int) {
		for range n {
			for i := range o.Groups() {
				o.Groups()[i].LR, o.Groups()[i].WD = 1e-2, 0.1*o.Groups()[i].WDMult
			}
			g.Unscale(0.5)
			g.ClipGradNorm(0.3)
			o.Step()
		}
	}
	for name, mk := range build {
		cpu := testParams(5, true)
		fillGrads(cpu, 2)
		sim := toSim(cpu)
		for _, p := range sim {
			if p.Data.Device() != tensor.Sim {
				t.Fatal("param not moved")
			}
		}
		oc, _ := mk(DefaultGroups(cpu))
		os, err := mk(DefaultGroups(sim))
		if err != nil {
			t.Fatal(err)
		}
		gc, _ := NewGrads(cpu)
		gs, _ := NewGrads(sim)
		grads := clone(cpu)
		steps(oc, gc, 1)
		setGrads(sim, grads)
		steps(os, gs, 1)
		for k := range cpu {
			sameBits(t, name+" "+cpu[k].Name, tensor.ToHost(sim[k].Data).Float32s(), cpu[k].Data.Float32s())
		}
		before := tensor.SimTransfers()
		st := os.State()
		if d := tensor.SimTransfers().ToHost - before.ToHost; d != int64(len(st.Buffers)) {
			t.Errorf("%s: State made %d host copies, want one per buffer (%d)", name, d, len(st.Buffers))
		}
		want := oc.State()
		for k, b := range want.Buffers {
			sameBits(t, name+" state "+k, st.Buffers[k], b)
		}
		// Resume on sim from the CPU's state, and on the CPU from sim's.
		rs := toSim(clone(cpu))
		or, _ := mk(DefaultGroups(rs))
		before = tensor.SimTransfers()
		if err := or.LoadState(want); err != nil {
			t.Fatal(err)
		}
		if d := tensor.SimTransfers().FromHost - before.FromHost; d != int64(len(want.Buffers)) {
			t.Errorf("%s: LoadState made %d copies to the device, want %d", name, d, len(want.Buffers))
		}
		rc := clone(cpu)
		oc2, _ := mk(DefaultGroups(rc))
		if err := oc2.LoadState(st); err != nil {
			t.Fatal(err)
		}
		gr, _ := NewGrads(rs)
		gc2, _ := NewGrads(rc)
		fillGrads(cpu, 8)
		grads = clone(cpu)
		setGrads(sim, grads)
		setGrads(rs, grads)
		setGrads(rc, grads)
		steps(oc, gc, 2)
		steps(os, gs, 2)
		steps(or, gr, 2)
		steps(oc2, gc2, 2)
		for k := range cpu {
			w := cpu[k].Data.Float32s()
			sameBits(t, name+" sim "+cpu[k].Name, tensor.ToHost(sim[k].Data).Float32s(), w)
			sameBits(t, name+" resumed on sim "+cpu[k].Name, tensor.ToHost(rs[k].Data).Float32s(), w)
			sameBits(t, name+" resumed on cpu "+cpu[k].Name, rc[k].Data.Float32s(), w)
		}
	}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v (bit for bit)", what, i, got[i], want[i])
		}
	}
}
