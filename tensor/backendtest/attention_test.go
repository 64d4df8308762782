package backendtest

import (
	"fmt"
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
