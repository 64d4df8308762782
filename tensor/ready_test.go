package tensor

import (
	"slices"
	"strings"
	"testing"
)

// readyModel is three linear layers; w0 is also used again at the end (a
// tied weight), so its gradient is final only when backward reaches the start.
func readyModel(tp *Tape, ws []*Tensor, x *Tensor, tie bool) *Tensor {
	h := x
	for _, w := range ws {
		h = tp.GELU(tp.Linear(h, w, nil), GELUTanh)
	}
	if tie {
		h = tp.Linear(h, ws[0], nil)
	}
	return tp.Sum(h)
}

func readyParams(n int) []*Tensor {
	rng := NewRNG(7)
	var ws []*Tensor
	for i := range n {
		w := Param("w"+string(rune('0'+i)), 4, 4)
		rng.Normal(w.Float32s(), 0, 0.5)
		ws = append(ws, w)
	}
	return ws
}

// TestGradReadyHookReportsFinalGradients: after the first (learning) pass,
// every parameter is reported during backward, before the steps that come
// after its last contribution, and its Grad then already equals the value
// it has at the end of the pass.
func TestGradReadyHookReportsFinalGradients(t *testing.T) {
	for _, tie := range []bool{false, true} {
		ws := readyParams(3)
		x := FromFloat32([]float32{0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8}, 2, 4)
		tp := NewTape()
		var order []string
		snap := map[string][]float32{}
		pass := 0
		tp.SetGradReadyHook(func(ready []*Tensor) {
			for _, w := range ready {
				order = append(order, w.Name)
				snap[w.Name] = slices.Clone(w.Grad.Float32s())
			}
			if pass == 1 && len(tp.steps) == 0 {
				t.Errorf("hook called after backward ended; want during it")
			}
		})
		for pass = 0; pass < 3; pass++ {
			order, snap = order[:0], map[string][]float32{}
			ZeroGrad(ws)
			if err := tp.Backward(readyModel(tp, ws, x, tie)); err != nil {
				t.Fatal(err)
			}
			tp.Reset()
			want := []string{"w2", "w1", "w0"}
			if !slices.Equal(order, want) {
				t.Fatalf("tie=%v pass %d: reported %v, want %v", tie, pass, order, want)
			}
			for _, w := range ws {
				if !slices.Equal(snap[w.Name], w.Grad.Float32s()) {
					t.Errorf("tie=%v pass %d: %s reported before its gradient was final", tie, pass, w.Name)
				}
			}
		}
	}
}

// TestGradReadyHookMidBackward: on planned passes the first-final parameter
// is reported while later steps are still to run.
func TestGradReadyHookMidBackward(t *testing.T) {
	ws := readyParams(3)
	x := FromFloat32([]float32{0.1, -0.2, 0.3, 0.4}, 1, 4)
	tp := NewTape()
	var firstGradOfW0 []float32
	tp.SetGradReadyHook(func(ready []*Tensor) {
		if ready[0].Name == "w2" && firstGradOfW0 == nil {
			firstGradOfW0 = slices.Clone(ws[0].Grad.Float32s())
		}
	})
	for pass := range 2 {
		firstGradOfW0 = nil
		ZeroGrad(ws)
		if err := tp.Backward(readyModel(tp, ws, x, false)); err != nil {
			t.Fatal(err)
		}
		tp.Reset()
		allZero := !slices.ContainsFunc(firstGradOfW0, func(v float32) bool { return v != 0 })
		if pass == 1 && !allZero {
			t.Errorf("planned pass: w2 was reported after w0's gradient was computed; want before")
		}
	}
}

// TestGradReadyHookDetectsChangedGraph: a pass whose graph adds to a
// reported parameter again fails instead of reporting a stale gradient.
func TestGradReadyHookDetectsChangedGraph(t *testing.T) {
	ws := readyParams(2)
	x := FromFloat32([]float32{0.1, -0.2, 0.3, 0.4}, 1, 4)
	tp := NewTape()
	tp.SetGradReadyHook(func([]*Tensor) {})
	if err := tp.Backward(readyModel(tp, ws, x, false)); err != nil {
		t.Fatal(err)
	}
	tp.Reset()
	// Same step names and count, the layers swapped: w1 is planned final
	// after the last linear's backward, but now receives its gradient from
	// the first linear, after being reported.
	h := tp.GELU(tp.Linear(x, ws[1], nil), GELUTanh)
	h = tp.GELU(tp.Linear(h, ws[0], nil), GELUTanh)
	loss := tp.Sum(h)
	err := tp.Backward(loss)
	if err == nil || !strings.Contains(err.Error(), "w1") {
		t.Fatalf("Backward on a different graph: err %v, want one naming w1", err)
	}
}
