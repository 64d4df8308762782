package tensor

import (
	"strings"
	"testing"
)

// TestMoveInto: a parameter moved into a view of a flat buffer keeps its
// values and shares the buffer's storage, on the CPU and on sim; mismatched
// devices and sizes are refused.
func TestMoveInto(t *testing.T) {
	for _, dev := range []Device{CPU, Sim} {
		p := FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3).ToDevice(dev)
		p.leaf = true
		flat := ZerosOn(dev, 10)
		var noGrad *Tape
		if err := p.MoveInto(noGrad.Narrow(flat, 0, 3, 6)); err != nil {
			t.Fatal(err)
		}
		ScaleList(mustList(t, p), 2)   // writes through p ...
		got := ToHost(flat).Float32s() // ... into the flat buffer
		want := []float32{0, 0, 0, 2, 4, 6, 8, 10, 12, 0}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%v: flat buffer %v, want %v", dev, got, want)
			}
		}
		if s := ToHost(p).Shape(); len(s) != 2 || s[0] != 2 || s[1] != 3 {
			t.Fatalf("%v: shape %v after the move", dev, s)
		}
	}
	p := Param("w", 4)
	if err := p.MoveInto(ZerosOn(Sim, 4)); err == nil || !strings.Contains(err.Error(), "cpu device, the destination on sim") {
		t.Errorf("move across devices: %v", err)
	}
	if err := p.MoveInto(Zeros(5)); err == nil || !strings.Contains(err.Error(), "destination of 5 values") {
		t.Errorf("move into the wrong size: %v", err)
	}
}

func mustList(t *testing.T, ts ...*Tensor) *TensorList {
	t.Helper()
	l, err := NewTensorList(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestAdoptAndRelease: Adopt points a parameter at new storage without
// copying (writes through either are seen by the other), Release drops it,
// and mismatched storage is refused naming the tensor.
func TestAdoptAndRelease(t *testing.T) {
	p := Param("w", 2, 3)
	p.Float32s()[0] = 7
	buf := Zeros(8)
	var noGrad *Tape
	view := noGrad.Narrow(buf, 0, 2, 6)
	if err := p.Adopt(view); err != nil {
		t.Fatal(err)
	}
	if p.Float32s()[0] != 0 {
		t.Fatalf("Adopt copied the old value %v", p.Float32s()[0])
	}
	buf.Float32s()[2] = 5
	if p.Float32s()[0] != 5 || p.Released() {
		t.Fatalf("after Adopt, w[0] = %v (want the storage's 5), released %v", p.Float32s()[0], p.Released())
	}
	p.Release()
	if !p.Released() {
		t.Fatal("Release left storage")
	}
	if err := p.Adopt(Zeros(5)); err == nil || !strings.Contains(err.Error(), "Adopt w") {
		t.Fatalf("Adopt of 5 values for (2, 3): %v, want a refusal naming w", err)
	}
}
