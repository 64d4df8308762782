package gpt

import (
	"fmt"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// DeepSeek sparse attention on a device: the golden models' training step
// (forward with the indexer loss, backward) with the model and batch moved
// to dev; it returns the logits, the lm loss, each layer's indexer loss
// and every parameter's gradient on the host.
func dsaDeviceStep(t *testing.T, name string, dev tensor.Device, r Recompute) (logits, loss []float32, indexer []float64, grads [][]float32, g golden, m *Model) {
	t.Helper()
	var bt Batch
	m, bt, g = newDSAGoldenModel(t, name)
	m.Recompute = r
	m.ToDevice(dev)
	b := onDevice(bt, dev)
	tp := tensor.NewTape()
	lg := m.Forward(tp, b, tensor.NewRNG(7), true)
	l := m.Loss(tp, lg, b)
	if err := tp.Backward(l); err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params() {
		grads = append(grads, tensor.ToHost(p.Grad).Float32s())
	}
	return tensor.ToHost(lg).Float32s(), tensor.ToHost(l).Float32s(), append([]float64(nil), m.dsa.losses...), grads, g, m
}

// TestSimDSAMatchesCPU: both golden DSA models' step on the simulated
// device — whose storage the model code cannot read — gives the CPU's
// logits, losses and gradients bit for bit, with and without selective
// recomputation.
func TestSimDSAMatchesCPU(t *testing.T) {
	for _, name := range []string{"dsa_dense_loss", "dsa_sparse_loss"} {
		for _, r := range []Recompute{{}, {Selective: true}} {
			cl, closs, cidx, cg, _, _ := dsaDeviceStep(t, name, tensor.CPU, r)
			sl, sloss, sidx, sg, _, m := dsaDeviceStep(t, name, tensor.Sim, r)
			sameBits(t, name+" logits", sl, cl)
			sameBits(t, name+" loss", sloss, closs)
			for i := range cidx {
				if sidx[i] != cidx[i] {
					t.Fatalf("%s layer %d indexer loss %v on sim, %v on the CPU", name, i, sidx[i], cidx[i])
				}
			}
			for i, p := range m.Params() {
				sameBits(t, name+" gradient of "+p.Name, sg[i], cg[i])
			}
		}
	}
}

// TestCUDADSAMatchesGolden: DeepSeek sparse attention on the GPU (dsa.cu's
// kernels between cuBLAS products) against tools/golden/dsa.py's PyTorch
// run of Megatron's functions: logits, lm loss, each layer's indexer loss
// and every gradient within 1e-3, the dense and the sparse loss, with each
// recomputation. It skips without a GPU and unless GOTRON_CUDA_UNVERIFIED
// names dsa: built, not yet run on a GPU (tools/gpu/check.sh unverified).
func TestCUDADSAMatchesGolden(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	for _, name := range []string{"dsa_dense_loss", "dsa_sparse_loss"} {
		for _, r := range deviceRecomputes {
			t.Run(fmt.Sprintf("%s-%+v", name, r), func(t *testing.T) {
				m0, _, _ := newDSAGoldenModel(t, name)
				if err := m0.Config.CheckDevice(tensor.CUDA); err != nil {
					t.Skip(err)
				}
				const tol = 1e-3
				logits, loss, indexer, grads, g, m := dsaDeviceStep(t, name, tensor.CUDA, r)
				cudaClose(t, "logits", logits, g.f32(t, "logits"), tol)
				cudaClose(t, "loss", loss, g.f32(t, "loss"), tol)
				for i, l := range indexer {
					cudaClose(t, fmt.Sprintf("layer %d indexer loss", i), []float32{float32(l)}, g.f32(t, fmt.Sprintf("indexer_loss/%d", i)), tol)
				}
				for i, p := range m.Params() {
					cudaClose(t, "grad of "+p.Name, grads[i], g.f32(t, "grad/"+p.Name), tol)
				}
			})
		}
	}
}
