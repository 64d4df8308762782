package train

import (
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestSimLtEpiloguesMatchCPU: training on the simulated device, whose
// Linear layers take the branches the CUDA backend runs through cuBLASLt's
// epilogues under cublaslt (the bias added in the forward product, fc1's
// bias and tanh GELU too; in float32, the bias gradient in the dW
// product), gives the CPU's losses,
// validation loss and final parameters bit for bit, in float32 and under
// --bf16 (bfloat16 operands, where the bias gradient stays SumRows), and
// the branches were taken.
func TestSimLtEpiloguesMatchCPU(t *testing.T) {
	defer tensor.SetSimLtEpilogues(tensor.SetSimLtEpilogues(true))
	for _, bf16 := range []bool{false, true} {
		cfg := tinyConfig(t)
		cfg.BF16, cfg.TrainIters = bf16, 3
		want := runOn(t, cfg, tensor.CPU)
		before := tensor.CUDALtCounts()
		got := runOn(t, cfg, tensor.Sim)
		d := tensor.CUDALtCounts().Sub(before)
		name := "fp32"
		if bf16 {
			name = "bf16"
		}
		sameDeviceRun(t, name+" with the epilogue branches on sim", got, want)
		if d.Bias == 0 || d.GELU == 0 || (d.BGrad == 0) != bf16 || d.Products != 0 {
			t.Errorf("%s: %v: want bias and bias-GELU branches, and bias-gradient ones in fp32 only", name, d)
		}
	}
}
