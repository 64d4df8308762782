package gpt

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// cudaClose fails t when got and want differ by more than tol·max(1, |want|)
// anywhere, naming the first element that does.
func cudaClose(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range want {
		d := math.Abs(float64(got[i])-float64(want[i])) / math.Max(1, math.Abs(float64(want[i])))
		if !(d <= worst) { // NaN counts as the worst
			worst, at = d, i
		}
	}
	if at >= 0 && !(worst <= tol) {
		t.Errorf("%s: element %d: %v, the CPU's %v (relative difference %.3g > %g)", what, at, got[at], want[at], worst, tol)
	}
}

// TestCUDAMatchesCPU: on a GPU, the training step (forward with dropout and
// document masks, loss, backward, recomputation) and decoding of GPT-2- and
// Llama-style models give the CPU's loss, every gradient and the logits
// within float32 tolerance. It skips without a GPU.
func TestCUDAMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	const tol = 1e-3
	for _, c := range []Config{gpt2Tiny(), llamaTiny()} {
		c.HiddenDropout, c.AttentionDropout = 0.1, 0.1
		bt := batches(c, 0, 1)[0]
		docs := make([]int32, 16)
		for i := range docs {
			docs[i] = int32(i % 8 / 5)
		}
		bt.DocIDs = tensor.FromInt32(docs, 2, 8)
		step := func(dev tensor.Device, rc Recompute) (float32, [][]float32) {
			m := stageModel(t, c)
			m.Recompute = rc
			m.ToDevice(dev)
			tp := tensor.NewTape()
			b := onDevice(bt, dev)
			loss := m.Loss(tp, m.Forward(tp, b, tensor.NewRNG(3), true), b)
			if err := tp.Backward(loss); err != nil {
				t.Fatal(err)
			}
			var grads [][]float32
			for _, p := range m.Params() {
				grads = append(grads, tensor.ToHost(p.Grad).Float32s())
			}
			return tensor.ToHost(loss).Float32s()[0], grads
		}
		for _, rc := range []Recompute{{}, {Selective: true}, {Full: true, Method: "uniform", NumLayers: 2}} {
			name := c.Activation.String()
			cl, cg := step(tensor.CPU, rc)
			gl, gg := step(tensor.CUDA, rc)
			cudaClose(t, name+" loss", []float32{gl}, []float32{cl}, tol)
			params := stageModel(t, c).Params()
			for i := range cg {
				cudaClose(t, name+" gradient of "+params[i].Name, gg[i], cg[i], tol)
			}
		}
		decode := func(dev tensor.Device) [][]float32 {
			m := stageModel(t, c)
			m.ToDevice(dev)
			kv := m.NewKVCache(8)
			toks := bt.Tokens.Int32s()
			var out [][]float32
			for _, n := range []int{3, 1, 2} {
				l, err := m.Decode(kv, toks[kv.Len:kv.Len+n])
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, l)
			}
			return out
		}
		want, got := decode(tensor.CPU), decode(tensor.CUDA)
		for i := range want {
			cudaClose(t, c.Activation.String()+" decode logits", got[i], want[i], tol)
		}
	}
}
