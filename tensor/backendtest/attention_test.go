package backendtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestAttentionConformance runs CheckAttention on the simulated device,
// whose kernels are the CPU's: bit for bit.
func TestAttentionConformance(t *testing.T) {
	if err := CheckAttention(strict{tensor.SimBackend()}, 0); err != nil {
		t.Error(err)
	}
}

// TestCheckAttentionCatchesErrors: a backend whose dk is off by one ulp in
// one element fails the check.
func TestCheckAttentionCatchesErrors(t *testing.T) {
	if err := CheckAttention(wrongAttn{tensor.SimBackend()}, 0); err == nil {
		t.Error("CheckAttention passed a backend with a wrong dk")
	}
}

type wrongAttn struct{ tensor.Backend }

func (b wrongAttn) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, cfg tensor.AttentionConfig) {
	b.Backend.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
	nudge(dk)
}

// TestCUDAAttention runs CheckAttention on the GPU (skipped without one) at
// the CUDA backend's float32 tolerance.
func TestCUDAAttention(t *testing.T) {
	be := cudaBackend(t)
	// Both of the backend's attentions: scores materialized for cuBLAS
	// (the default at these sizes) and the flash kernels (limit 0).
	for _, limit := range []int64{1 << 30, 0} {
		prev := tensor.SetCUDAAttentionScoresLimit(limit)
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return CheckAttention(strict{be}, cudaTol)
		}()
		tensor.SetCUDAAttentionScoresLimit(prev)
		if err != nil {
			t.Errorf("scores limit %d: %v", limit, err)
		}
	}
}

// TestBlockAttentionConformance runs CheckBlockAttention on the simulated
// device: bit for bit.
func TestBlockAttentionConformance(t *testing.T) {
	if err := CheckBlockAttention(strict{tensor.SimBackend()}, 0); err != nil {
		t.Error(err)
	}
	if err := CheckBlockAttention(wrongAttn{tensor.SimBackend()}, 0); err == nil {
		t.Error("CheckBlockAttention passed a backend with a wrong dk")
	}
}

// TestCUDABlockAttention runs CheckBlockAttention on the GPU (skipped
// without one) at the CUDA backend's float32 tolerance, on the materialized
// path, the one that has block attention; the flash kernels (scores limit
// 0) must refuse it naming the limit.
func TestCUDABlockAttention(t *testing.T) {
	be := cudaBackend(t)
	check := func(limit int64) (err error) {
		prev := tensor.SetCUDAAttentionScoresLimit(limit)
		defer tensor.SetCUDAAttentionScoresLimit(prev)
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return CheckBlockAttention(strict{be}, cudaTol)
	}
	if err := check(1 << 30); err != nil {
		t.Error(err)
	}
	if err := check(0); err == nil || !strings.Contains(err.Error(), "materialized path only") {
		t.Errorf("block attention on the flash kernels: %v, want a refusal naming the materialized path", err)
	}
}

// TestCUDAAttentionReducedPrecision runs CheckAttention on the GPU
// (skipped without one) with the materialized attention's products in bf16
// and in fp16 (SetCUDAAttentionReducedPrecision on), against the CPU's
// float32, within cudaTolAttnBF16 and cudaTolAttnFP16.
func TestCUDAAttentionReducedPrecision(t *testing.T) {
	be := cudaBackend(t)
	prevLimit := tensor.SetCUDAAttentionScoresLimit(1 << 30)
	prevOn := tensor.SetCUDAAttentionReducedPrecision(true)
	// bf16 calls take the tensor-core kernels while those are on
	// (GOTRON_CUDA_UNVERIFIED=1 at OpenCUDA): this test is the materialized path's
	prevTC := tensor.SetCUDAAttentionTensorCores(false)
	defer func() {
		tensor.SetCUDAAttentionScoresLimit(prevLimit)
		tensor.SetCUDAAttentionReducedPrecision(prevOn)
		tensor.SetCUDAAttentionTensorCores(prevTC)
	}()
	for _, c := range []struct {
		prec tensor.MatmulPrecision
		tol  float64
	}{{tensor.MatmulBF16, cudaTolAttnBF16}, {tensor.MatmulFP16, cudaTolAttnFP16}} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return CheckAttentionPrecision(strict{be}, c.prec, c.tol)
		}()
		if err != nil {
			t.Errorf("precision %v: %v", c.prec, err)
		}
	}
}

// TestCUDAAttentionTensorCores runs the CUDA backend's tensor-core flash
// attention (SetCUDAAttentionTensorCores on, bf16) on the GPU (skipped
// without one) against the CPU's float32 attention, whole sequences and
// blocks, within cudaTolAttnTC.
func TestCUDAAttentionTensorCores(t *testing.T) {
	be := cudaBackend(t)
	prev := tensor.SetCUDAAttentionTensorCores(true)
	defer tensor.SetCUDAAttentionTensorCores(prev)
	for name, check := range map[string]func(tensor.Backend, float64) error{
		"whole sequences": CheckAttentionTensorCores, "blocks": CheckBlockAttentionTensorCores,
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return check(strict{be}, cudaTolAttnTC)
		}()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAttentionTensorCoresCasesConformance runs the tensor-core cases on
// the simulated device (the CPU's kernels, whatever the precision): bit for
// bit, so the cases themselves are valid calls.
func TestAttentionTensorCoresCasesConformance(t *testing.T) {
	if err := CheckAttentionTensorCores(strict{tensor.SimBackend()}, 0); err != nil {
		t.Error(err)
	}
	if err := CheckBlockAttentionTensorCores(strict{tensor.SimBackend()}, 0); err != nil {
		t.Error(err)
	}
}
