package gpt_test

import (
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// BenchmarkTrainStep times one micro-batch's forward, loss and backward (no
// optimizer step) of GPT-style models on the CPU, in fp32: the step the
// one-layer refactor and the device seam must not slow down. It reports
// tokens/s and the model's GFLOP/s (6·params + 6·layers·seq·hidden per
// token, Megatron's count without the recompute term). Run it at two
// commits interleaved (docs/design/compute.md, "Cost of the seam").
func BenchmarkTrainStep(b *testing.B) {
	for _, c := range []struct {
		name                                 string
		layers, hidden, heads, batch, seqLen int
	}{
		{"6L-d384-B8-T256", 6, 384, 6, 8, 256},
		{"gpt2-124M-B4-T256", 12, 768, 12, 4, 256},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg, err := gpt.Preset("gpt2-small")
			if err != nil {
				b.Fatal(err)
			}
			cfg.NumLayers, cfg.HiddenSize, cfg.NumAttentionHeads = c.layers, c.hidden, c.heads
			m, err := gpt.New(cfg, tensor.NewRNG(1).Fork("init"))
			if err != nil {
				b.Fatal(err)
			}
			n := c.batch * c.seqLen
			u := make([]float32, 2*n)
			tensor.NewRNG(2).Uniform(u, 0, float32(cfg.VocabSize))
			tok, lab := make([]int32, n), make([]int32, n)
			for i := range tok {
				tok[i], lab[i] = int32(u[i])%int32(cfg.VocabSize), int32(u[n+i])%int32(cfg.VocabSize)
			}
			bt := gpt.Batch{Tokens: tensor.FromInt32(tok, c.batch, c.seqLen), Labels: tensor.FromInt32(lab, c.batch, c.seqLen)}
			tp := tensor.NewTape()
			step := func() {
				loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
				if err := tp.Backward(loss); err != nil {
					b.Fatal(err)
				}
				tp.Reset()
			}
			step() // the arena's buffers, the kernels' workspaces
			b.ResetTimer()
			for range b.N {
				step()
			}
			s := b.Elapsed().Seconds() / float64(b.N)
			flops := float64(n) * (6*float64(m.NumParams()) + 6*float64(c.layers*c.seqLen*c.hidden))
			b.ReportMetric(float64(n)/s, "tokens/s")
			b.ReportMetric(flops/s/1e9, "GFLOP/s")
		})
	}
}
