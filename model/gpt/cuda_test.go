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
		c, bt := deviceCase(c)
		name := c.Activation.String()
		for _, rc := range deviceRecomputes {
			cl, cg := deviceStep(t, c, bt, tensor.CPU, rc)
			gl, gg := deviceStep(t, c, bt, tensor.CUDA, rc)
			cudaClose(t, name+" loss", []float32{gl}, []float32{cl}, tol)
			params := stageModel(t, c).Params()
			for i := range cg {
				cudaClose(t, name+" gradient of "+params[i].Name, gg[i], cg[i], tol)
			}
		}
		want, got := deviceDecode(t, c, bt, tensor.CPU, false), deviceDecode(t, c, bt, tensor.CUDA, false)
		for i := range want {
			cudaClose(t, name+" decode logits", got[i], want[i], tol)
		}
	}
}

// TestCUDAMoEMatchesCPU: an MoE model's training step (the router on the
// host, the experts' grouped GEMM as cuBLAS products, the dispatch's gathers
// and scatters on the device) gives the CPU's loss and every gradient within
// float32 tolerance on a GPU. It skips without one. (Not yet run on a GPU:
// the top-k choice could flip on a near tie, which would show as a large
// difference in the router's and experts' gradients.)
func TestCUDAMoEMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	const tol = 1e-3
	c, bt := deviceCase(moeTestConfig())
	cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{})
	gl, gg := deviceStep(t, c, bt, tensor.CUDA, Recompute{})
	cudaClose(t, "moe loss", []float32{gl}, []float32{cl}, tol)
	params := stageModel(t, c).Params()
	for i := range cg {
		cudaClose(t, "moe gradient of "+params[i].Name, gg[i], cg[i], tol)
	}
}

// TestCUDAMoERouterMatchesCPU is TestCUDAMoEMatchesCPU with the router on
// the device (GOTRON_CUDA_UNVERIFIED naming moe-router) for the
// configurations its kernels take: aux-loss-free balancing (sigmoid scores,
// the expert bias, groups), softmax without losses, softmax with aux_loss
// and seq_aux_loss, and moeTestConfig's aux_loss with the z-loss; the
// dispatcher's permutation is built on the device (no upload). Built, not
// yet run on a GPU (tools/gpu/check.sh unverified).
func TestCUDAMoERouterMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	defer tensor.SetCUDARouter(tensor.SetCUDARouter(true))
	const tol = 1e-3
	sigmoid := moeTestConfig()
	sigmoid.MoE.AuxLossCoeff, sigmoid.MoE.ZLossCoeff = 0, 0
	sigmoid.MoE.Score, sigmoid.MoE.ExpertBias, sigmoid.MoE.NumGroups, sigmoid.MoE.GroupTopK = ScoreSigmoid, true, 2, 1
	softmax := moeTestConfig()
	softmax.MoE.AuxLossCoeff, softmax.MoE.ZLossCoeff = 0, 0
	auxLoss := moeTestConfig() // aux_loss and seq_aux_loss: their statistics on the device
	auxLoss.MoE.ZLossCoeff, auxLoss.MoE.SeqAuxLossCoeff = 0, 0.02
	zLoss := moeTestConfig() // aux_loss and the z-loss (1e-3)
	for _, cfg := range []Config{sigmoid, softmax, auxLoss, zLoss} {
		c, bt := deviceCase(cfg)
		cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{})
		before := tensor.CUDATransfers()
		gl, gg := deviceStep(t, c, bt, tensor.CUDA, Recompute{})
		// the permutation is built on the device: nothing uploaded for it
		if s := tensor.CUDATransfers().Sub(before).Sites["tensor.(*Routing).PermutationOn"]; s.In != 0 || s.Out != 0 {
			t.Errorf("the dispatcher's permutation was copied %+v, want none (built on the GPU)", s)
		}
		cudaClose(t, "moe loss", []float32{gl}, []float32{cl}, tol)
		params := stageModel(t, c).Params()
		for i := range cg {
			cudaClose(t, "moe gradient of "+params[i].Name, gg[i], cg[i], tol)
		}
	}
}

// TestCUDAMoEGroupedMatchesCPU is TestCUDAMoEMatchesCPU with
// --moe-grouped-gemm and the GPU's grouped GEMM on (GOTRON_CUDA_UNVERIFIED
// naming moe-grouped): every expert product one cublasGemmGroupedBatchedEx
// call. It needs cuBLAS 12.5 or later; built, not yet run on a GPU
// (tools/gpu/check.sh unverified).
func TestCUDAMoEGroupedMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if !tensor.CUDADevice().HasGroupedGemm() {
		v, path := tensor.CUDADevice().BLASVersion()
		t.Skipf("cuBLAS %d (%s) has no cublasGemmGroupedBatchedEx", v, path)
	}
	defer tensor.SetCUDAGroupedGemm(tensor.SetCUDAGroupedGemm(true))
	const tol = 1e-3
	cfg := moeTestConfig()
	cfg.MoE.GroupedGEMM = true
	c, bt := deviceCase(cfg)
	cl, cg := deviceStep(t, c, bt, tensor.CPU, Recompute{})
	before := tensor.CUDAGroupedGemms()
	gl, gg := deviceStep(t, c, bt, tensor.CUDA, Recompute{})
	// two MoE layers, fc1 and fc2 each: forward, data and weight gradients
	if n := tensor.CUDAGroupedGemms() - before; n != 12 {
		t.Errorf("%d grouped GEMM calls in a step, want 12", n)
	}
	cudaClose(t, "moe loss", []float32{gl}, []float32{cl}, tol)
	params := stageModel(t, c).Params()
	for i := range cg {
		cudaClose(t, "moe gradient of "+params[i].Name, gg[i], cg[i], tol)
	}
}
