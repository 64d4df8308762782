package gpt_test

import (
	"slices"
	"testing"
	"time"

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

// BenchmarkFusions times training steps (forward with hidden dropout 0.1,
// loss, backward) with every fusion on (the default), with only the
// residual add + norm apart (Fusions.NoAddNorm: "addnorm-off") and with
// all off (--no-bias-gelu-fusion --no-bias-dropout-fusion and NoAddNorm),
// rotating step by step so that all see the same machine load, and reports
// each one's median step time and the activations its tape holds after the
// forward pass (docs/design/compute.md, "Fusions"). Run it with
// -benchtime Nx for N steps of each.
func BenchmarkFusions(b *testing.B) {
	for _, c := range []struct {
		name                                 string
		layers, hidden, heads, batch, seqLen int
	}{
		{"4L-d256-B8-T256", 4, 256, 4, 8, 256},
		{"gpt2-124M-B1-T256", 12, 768, 12, 1, 256},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg, err := gpt.Preset("gpt2-small")
			if err != nil {
				b.Fatal(err)
			}
			cfg.NumLayers, cfg.HiddenSize, cfg.NumAttentionHeads = c.layers, c.hidden, c.heads
			cfg.HiddenDropout = 0.1
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
			modes := []gpt.Fusions{{}, {NoAddNorm: true}, {NoBiasGELU: true, NoBiasDropout: true, NoAddNorm: true}}
			tapes := []*tensor.Tape{tensor.NewTape(), tensor.NewTape(), tensor.NewTape()}
			times := [3][]float64{}
			live := [3]int{}
			step := func(k int) time.Duration {
				m.Fusions = modes[k]
				tp, start := tapes[k], time.Now()
				loss := m.Loss(tp, m.Forward(tp, bt, tensor.NewRNG(3), true), bt)
				live[k] = tp.LiveFloats()
				if err := tp.Backward(loss); err != nil {
					b.Fatal(err)
				}
				tp.Reset()
				return time.Since(start)
			}
			for k := range modes { // the arenas' buffers, the kernels' workspaces
				step(k)
			}
			b.ResetTimer()
			for i := range b.N {
				for j := range modes { // each goes first every third time
					k := (i + j) % len(modes)
					times[k] = append(times[k], step(k).Seconds()*1e3)
				}
			}
			for k, name := range []string{"fused", "addnorm-off", "unfused"} {
				slices.Sort(times[k])
				b.ReportMetric(times[k][len(times[k])/2], name+"-ms/step")
				b.ReportMetric(float64(live[k])*4/(1<<20), name+"-activation-MiB")
			}
		})
	}
}
