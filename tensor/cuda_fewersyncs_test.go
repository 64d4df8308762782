package tensor

import (
	"math"
	"testing"

	"github.com/gotron/gotron/internal/cuda/kernels"
)

// TestLossMaskScaleDevArgsMatchPTX checks, without a GPU, that
// reduce_loss_mask_scale_dev_f32's launch arguments (fewer-syncs) match its
// parameters in the embedded PTX one for one in size.
func TestLossMaskScaleDevArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		const name = "reduce_loss_mask_scale_dev_f32"
		checkArgsMatchPTX(t, arch, string(mods["reduce"]), name, lossMaskScaleDevArgs(0, 0, 0, 1))
	}
}

// TestXentVocabBwdDevArgsMatchPTX checks xent_vocab_bwd_dev_f32's launch
// arguments (fewer-syncs) against its PTX parameters.
func TestXentVocabBwdDevArgsMatchPTX(t *testing.T) {
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		mods, err := kernels.PTX(arch[0], arch[1])
		if err != nil {
			t.Fatal(err)
		}
		const name = "xent_vocab_bwd_dev_f32"
		checkArgsMatchPTX(t, arch, string(mods["xent"]), name, xentVocabBwdDevArgs(0, 0, 0, 0, 0, 0, 0, 1, 1, 0))
	}
}

// TestReadBack: host copies of tensors of several dtypes (a nil entry, a
// strided view) read back together: the CPU's are the tensors themselves,
// the simulated device's one counted copy (backendtest.TestCUDAReadBack
// checks the GPU's).
func TestReadBack(t *testing.T) {
	mk := func(dev Device) []*Tensor {
		f := FromFloat32([]float32{1.5, -2, float32(math.NaN())}, 3)
		i := FromInt32([]int32{7}, 1)
		l := New(Int64, 1)
		l.i64[0] = int64(math.Float64bits(math.Pi))
		m := FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
		ts := []*Tensor{f.ToDevice(dev), nil, i.ToDevice(dev), l.ToDevice(dev), nil}
		ts[4] = (*Tape)(nil).Transpose(m.ToDevice(dev), 0, 1) // a strided view
		return ts
	}
	check := func(what string, got []*Tensor) {
		t.Helper()
		if got[1] != nil {
			t.Errorf("%s: a nil entry read back as %v", what, got[1])
		}
		f := got[0].Float32s()
		if f[0] != 1.5 || f[1] != -2 || !math.IsNaN(float64(f[2])) {
			t.Errorf("%s: float32s %v", what, f)
		}
		if got[2].Int32s()[0] != 7 || Float64Bits(got[3]) != math.Pi {
			t.Errorf("%s: int32 %v, float64 bits %v", what, got[2].Int32s(), Float64Bits(got[3]))
		}
		if v := got[4].Contiguous().Float32s(); len(v) != 6 || v[0] != 1 || v[1] != 4 || v[5] != 6 {
			t.Errorf("%s: transposed view %v, want [1 4 2 5 3 6]", what, v)
		}
	}
	cpu := mk(CPU)
	got := ReadBack(cpu...)
	check("cpu", got)
	if got[0] != cpu[0] {
		t.Errorf("on the CPU ReadBack copied")
	}
	sim := mk(Sim)
	before := SimTransfers()
	got = ReadBack(sim...)
	d := SimTransfers().Sub(before)
	check("sim", got)
	if d.ToHost != 1 || d.FromHost != 0 || d.ToHostBytes != 12+4+8+24 {
		t.Errorf("sim: %d out (%d bytes), %d in; want one copy of 48 bytes", d.ToHost, d.ToHostBytes, d.FromHost)
	}
	if d.Sites["tensor.TestReadBack"].Out != 1 {
		t.Errorf("sim: sites %v, want the copy under tensor.TestReadBack", d.Sites)
	}
}
