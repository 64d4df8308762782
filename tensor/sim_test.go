package tensor

import (
	"math"
	"strings"
	"testing"
)

// mustPanic runs fn and returns its panic message ("" when it did not panic).
func mustPanic(fn func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg, _ = r.(string)
			if msg == "" {
				msg = "panic"
			}
		}
	}()
	fn()
	return ""
}

// TestSimRefusesHostAccess: the simulated device's storage cannot be read
// by host accessors, only through the counted copies.
func TestSimRefusesHostAccess(t *testing.T) {
	x := FromFloat32([]float32{1, 2, 3, 4}, 2, 2)
	ids := FromInt32([]int32{1, 0}, 2)
	before := SimTransfers()
	sx, sids := x.ToDevice(Sim), ids.ToDevice(Sim)
	for name, fn := range map[string]func(){
		"Float32s": func() { sx.Float32s() },
		"Int32s":   func() { sids.Int32s() },
		"At":       func() { sx.At(0, 1) },
	} {
		if msg := mustPanic(fn); !strings.Contains(msg, "ToHost") {
			t.Errorf("%s of a sim tensor: panic %q, want one naming tensor.ToHost", name, msg)
		}
	}
	back := ToHost(sx)
	if got := back.Float32s(); got[3] != 4 || back.Device() != CPU {
		t.Errorf("ToHost: %v on %v", got, back.Device())
	}
	if ToHost(x) != x || x.ToDevice(CPU) != x {
		t.Error("ToHost of a CPU tensor copied it")
	}
	d := SimTransfers()
	if d.FromHost-before.FromHost != 2 || d.ToHost-before.ToHost != 1 || d.Bytes-before.Bytes != 16+8+16 {
		t.Errorf("transfers: %+v then %+v, want 2 to sim and 1 back, 40 bytes", before, d)
	}
}

// TestSimMixedDevicesPanics: an op given tensors of two devices refuses,
// naming both.
func TestSimMixedDevicesPanics(t *testing.T) {
	x := FromFloat32([]float32{1, 2, 3, 4}, 2, 2)
	w := Param("w", 3, 2)
	MoveParams(Sim, w)
	var tp *Tape
	if msg := mustPanic(func() { tp.Linear(x, w, nil) }); !strings.Contains(msg, "two devices") || !strings.Contains(msg, "sim") {
		t.Errorf("Linear of a cpu input and a sim weight: panic %q", msg)
	}
	if _, err := NewTensorList(x, w); err == nil {
		t.Error("a tensor list over two devices was accepted")
	}
}

// TestSimMatchesCPU: a small training graph (linear, norm, GELU, RoPE,
// attention, embedding, cross-entropy, backward) on the simulated device
// gives the CPU's outputs and gradients bit for bit, with its activations
// and gradients on the device.
func TestSimMatchesCPU(t *testing.T) {
	run := func(dev Device) (loss float32, grads [][]float32, outDev Device) {
		rng := NewRNG(7)
		b, tt, h, heads := 2, 5, 8, 2
		emb, w, norm := Param("emb", 11, h), Param("w", 3*h, h), Param("norm", h)
		rng.Fork("emb").Normal(emb.Float32s(), 0, 1)
		rng.Fork("w").Normal(w.Float32s(), 0, 0.3)
		for i := range norm.Float32s() {
			norm.Float32s()[i] = 1
		}
		rope, err := NewRoPE(RoPEConfig{Dim: 4, MaxPositions: 8})
		if err != nil {
			t.Fatal(err)
		}
		params := []*Tensor{emb, w, norm}
		MoveParams(dev, params...)
		tokens := FromInt32([]int32{1, 4, 2, 9, 10, 3, 3, 0, 5, 7}, b, tt).ToDevice(dev)
		labels := FromInt32([]int32{4, 2, 9, 10, 3, 3, 0, 5, 7, 1}, b*tt).ToDevice(dev)
		tp := NewTape()
		x := tp.Embedding(tokens, emb)
		x = tp.RMSNorm(x, norm, 1e-5)
		parts := tp.Split(tp.Reshape(tp.Linear(x, w, nil), b, tt, 3, heads, h/heads), 2, 1, 1, 1)
		q := tp.RoPE(tp.Reshape(parts[0], b, tt, heads, h/heads), rope, nil)
		k := tp.RoPE(tp.Reshape(parts[1], b, tt, heads, h/heads), rope, nil)
		v := tp.Reshape(parts[2], b, tt, heads, h/heads)
		o := tp.GELU(tp.Reshape(tp.Attention(q, k, v, AttentionOptions{Causal: true}), b, tt, h), GELUTanh)
		logits := tp.Linear(o, emb, nil)
		l := tp.CrossEntropy(tp.Reshape(logits, b*tt, 11), labels, CrossEntropyOptions{})
		if err := tp.Backward(l); err != nil {
			t.Fatal(err)
		}
		for _, p := range params {
			grads = append(grads, ToHost(p.Grad).Float32s())
		}
		return ToHost(l).Float32s()[0], grads, logits.Device()
	}
	cl, cg, _ := run(CPU)
	sl, sg, dev := run(Sim)
	if dev != Sim {
		t.Errorf("logits of sim inputs live on %v", dev)
	}
	if math.Float32bits(cl) != math.Float32bits(sl) {
		t.Errorf("loss: cpu %v, sim %v", cl, sl)
	}
	for i := range cg {
		for j := range cg[i] {
			if math.Float32bits(cg[i][j]) != math.Float32bits(sg[i][j]) {
				t.Fatalf("gradient %d element %d: cpu %v, sim %v", i, j, cg[i][j], sg[i][j])
			}
		}
	}
}

// TestSimCountsBackendCopies: the simulated backend counts, by site, the
// copies the CUDA backend makes on its own — a list's device tables once
// (again after a tensor's storage moved), the optimizer's coefficients on
// every update, each statistic read back — and the explicit copies under
// the function that asked for them.
func TestSimCountsBackendCopies(t *testing.T) {
	mk := func() *Tensor { return FromFloat32([]float32{1, -2, 3}, 3).ToDevice(Sim) }
	p, g, m, v := mk(), mk(), mk(), mk()
	list := func(ts ...*Tensor) *TensorList {
		l, err := NewTensorList(ts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	lp, lg, lm, lv := list(p), list(g), list(m), list(v)
	c := []AdamWCoeffs{{Beta1: 0.9, Beta2: 0.999, OneMinusBeta1: 0.1, OneMinusBeta2: 0.001, Eps: 1e-8, BC1: 1, BC2: 1, LR: 1e-3}}
	before := SimTransfers()
	AdamW(lp, lg, lm, lv, c)
	AdamW(lp, lg, lm, lv, c)
	if s := SumSquares(lg); s != 14 {
		t.Errorf("SumSquares = %v, want 14", s)
	}
	NonFinite(lg)
	ToHost(p)
	d := SimTransfers().Sub(before)
	want := map[string]SiteTransfers{
		siteListTables:  {In: 4 * 3}, // four lists, three tables each, once
		siteAdamWCoeffs: {In: 2},
		// SumSquares, NonFinite and ToHost read back a copy each
		"tensor.TestSimCountsBackendCopies": {Out: 3},
	}
	if len(d.Sites) != len(want) {
		t.Errorf("sites %v, want %v", d.Sites, want)
	}
	for k, w := range want {
		if d.Sites[k] != w {
			t.Errorf("%s: %+v, want %+v (all: %v)", k, d.Sites[k], w, d.Sites)
		}
	}
	if d.FromHost != 14 || d.ToHost != 3 {
		t.Errorf("%d in, %d out; want 14 and 3", d.FromHost, d.ToHost)
	}
	// the gradient's storage moves: its list's tables are copied again
	lg2 := list(mk())
	before = SimTransfers()
	SumSquares(lg2)
	SumSquares(lg2)
	if got := SimTransfers().Sub(before).Sites[siteListTables]; got.In != 3 {
		t.Errorf("a new list's tables: %+v, want 3 copies in once", got)
	}
}
