package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/gotron/gotron/tensor"
)

// BenchmarkCUDAAttention times one causal attention forward plus backward
// on the GPU (skipped without one) on each of the backend's paths — the
// tensor-core flash kernels (bf16), the float32 flash kernels and the
// materialized cuBLAS path (float32 and, SetCUDAAttentionReducedPrecision
// on, bf16 products) — at GPT-2's head shape (12 heads of 64) and at 16
// heads of 128, T 1024 and 4096, and reports TFLOP/s by FlashAttention's
// count (forward 4·B·H·T²·D, the backward 2.5 times that, halved for the
// causal mask), which tools/gpu/peer_attn.py uses for PyTorch's SDPA.
// check.sh's bench step runs it.
func BenchmarkCUDAAttention(b *testing.B) {
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	be := tensor.CUDABackend()
	dev := be.Device()
	for _, s := range []struct{ B, T, H, D int }{{8, 1024, 12, 64}, {2, 4096, 12, 64}, {4, 1024, 16, 128}, {1, 4096, 16, 128}} {
		for _, path := range []string{"flash-tc-bf16", "flash-f32", "materialized-f32", "materialized-bf16"} {
			b.Run(fmt.Sprintf("B%d-T%d-H%d-D%d/%s", s.B, s.T, s.H, s.D, path), func(b *testing.B) {
				prevTC := tensor.SetCUDAAttentionTensorCores(path == "flash-tc-bf16")
				prevRed := tensor.SetCUDAAttentionReducedPrecision(path == "materialized-bf16")
				limit := int64(0)
				if path == "materialized-f32" || path == "materialized-bf16" {
					limit = 1 << 31
				}
				prevLimit := tensor.SetCUDAAttentionScoresLimit(limit)
				defer func() {
					tensor.SetCUDAAttentionTensorCores(prevTC)
					tensor.SetCUDAAttentionReducedPrecision(prevRed)
					tensor.SetCUDAAttentionScoresLimit(prevLimit)
				}()
				prec := tensor.MatmulFP32
				if path == "flash-tc-bf16" || path == "materialized-bf16" {
					prec = tensor.MatmulBF16
				}
				cfg := tensor.AttentionConfig{B: s.B, T: s.T, HQ: s.H, HKV: s.H, D: s.D, Causal: true, Precision: prec}
				n := s.B * s.T * s.H * s.D
				rng := tensor.NewRNG(1)
				x := make([]float32, n)
				rng.Normal(x, 0, 1)
				q, k, v, dout := onDev(dev, x, s.B, s.T, s.H, s.D), onDev(dev, x, s.B, s.T, s.H, s.D), onDev(dev, x, s.B, s.T, s.H, s.D), onDev(dev, x, s.B, s.T, s.H, s.D)
				out, lse := tensor.ZerosOn(dev, s.B, s.T, s.H, s.D), tensor.ZerosOn(dev, s.B, s.H, s.T)
				dq, dk, dv := tensor.ZerosOn(dev, s.B, s.T, s.H, s.D), tensor.ZerosOn(dev, s.B, s.T, s.H, s.D), tensor.ZerosOn(dev, s.B, s.T, s.H, s.D)
				step := func() {
					be.AttentionForward(out, lse, q, k, v, cfg)
					be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
				}
				sync := func() {
					if err := tensor.CUDADevice().Synchronize(); err != nil {
						b.Fatal(err)
					}
				}
				step() // warm-up: JIT, allocator
				sync()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					step()
				}
				sync()
				per := time.Since(start).Seconds() / float64(b.N)
				flops := 3.5 * 4 * float64(s.B*s.H*s.D) * float64(s.T) * float64(s.T) / 2
				b.ReportMetric(flops/per/1e12, "TFLOP/s")
				b.ReportMetric(per*1e3, "ms/fwd+bwd")
			})
		}
	}
}
