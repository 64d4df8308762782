package train

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestCUDATrainingMatchesCPU: 50 iterations of single-process training on
// a GPU — dropout, clipping, AdamW, evaluation — follow the CPU's losses
// within float32 tolerance (bf16 tolerance with --bf16), and end with the
// CPU's parameters as closely. It skips without a GPU.
func TestCUDATrainingMatchesCPU(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprintf("bf16=%v", bf16), func(t *testing.T) {
			cfg := tinyConfig(t)
			cfg.TrainIters, cfg.EvalInterval = 50, 25
			cfg.BF16 = bf16
			tol := 2e-3
			if bf16 {
				tol = 3e-2
			}
			want := runOn(t, cfg, tensor.CPU)
			before := tensor.BF16GemmOperandCounts()
			got := runOn(t, cfg, tensor.CUDA)
			if d := tensor.BF16GemmOperandCounts().Sub(before); bf16 {
				// gemm-bf16: every product reads bfloat16 operands (the
				// weights' copies, activations cast once); else none does
				on := tensor.CUDAUnverified(os.Getenv, "gemm-bf16")
				if on && (d.BF16OperandProducts == 0 || d.FP32OperandProducts != 0) || !on && d.BF16OperandProducts != 0 {
					t.Errorf("GOTRON_CUDA_UNVERIFIED=%q: %v", os.Getenv("GOTRON_CUDA_UNVERIFIED"), d)
				}
				if i := strings.Index(got.log, "bf16 GEMM operands: "); i >= 0 {
					t.Logf("%s", strings.TrimSpace(got.log[i:]))
				}
			}
			if len(got.res.Losses) != len(want.res.Losses) {
				t.Fatalf("%d iterations, want %d", len(got.res.Losses), len(want.res.Losses))
			}
			for i, w := range want.res.Losses {
				g := got.res.Losses[i]
				if d := math.Abs(g-w) / math.Max(1, math.Abs(w)); !(d <= tol) {
					t.Fatalf("iteration %d: loss %v on cuda, the CPU's %v (relative difference %.3g > %g)", i+1, g, w, d, tol)
				}
			}
			t.Logf("final loss %v on cuda, %v on the CPU; validation %v, %v", got.res.Losses[len(got.res.Losses)-1],
				want.res.Losses[len(want.res.Losses)-1], got.res.ValidLoss, want.res.ValidLoss)
		})
	}
}

// TestCUDAStepReadsBack counts a GPU training step's device-to-host
// copies: under GOTRON_CUDA_UNVERIFIED=fewer-syncs one (the found-inf flag,
// Σg² and the micro-batches' losses packed on the device), as
// TestSimStepReadsBackOnce counts on the simulated device; without it one
// per tensor read back (3) and each micro-batch's loss-mask sum. It skips
// without a GPU.
func TestCUDAStepReadsBack(t *testing.T) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	const n = 3
	cfg := tinyConfig(t)
	cfg.GlobalBatchSize, cfg.Device, cfg.Out = n*cfg.MicroBatchSize, tensor.CUDA, io.Discard
	tr, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(3 + n)
	if tensor.CUDAUnverified(os.Getenv, "fewer-syncs") {
		want = 1
	}
	for i := range 3 {
		before := tensor.CUDATransfers()
		if _, err := tr.stepper.step(context.Background()); err != nil {
			t.Fatal(err)
		}
		d := tensor.CUDATransfers().Sub(before)
		t.Logf("iteration %d: %d in, %d out: %v", i+1, d.FromHost, d.ToHost, d.Sites)
		if d.ToHost != want {
			t.Errorf("iteration %d: %d device-to-host copies, want %d (GOTRON_CUDA_UNVERIFIED=%q)", i+1, d.ToHost, want, os.Getenv("GOTRON_CUDA_UNVERIFIED"))
		}
	}
}
