package backendtest

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestSimOps: every core op on the simulated device is the CPU's, bit for
// bit, outputs and gradients on the device.
func TestSimOps(t *testing.T) {
	if err := CheckOps(tensor.Sim, 0); err != nil {
		t.Fatal(err)
	}
}

// TestCheckOpsCatchesDifferences: a case whose output differs between
// devices is reported (here a dropout drawn from another stream on the
// second run).
func TestCheckOpsCatchesDifferences(t *testing.T) {
	calls := 0
	c := OpCase{Name: "drift", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1, 64)} },
		Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			calls++
			return tp.Dropout(in[0], 0.5, tensor.NewRNG(uint64(calls)))
		}}
	want, err := runOp(c, tensor.CPU)
	if err != nil {
		t.Fatal(err)
	}
	got, err := runOp(c, tensor.Sim)
	if err != nil {
		t.Fatal(err)
	}
	if err := closeAll("drift", got.out, want.out, 0); err == nil || !strings.Contains(err.Error(), "bit for bit") {
		t.Errorf("differing outputs: %v", err)
	}
}
