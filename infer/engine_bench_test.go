package infer

import (
	"fmt"
	"runtime/debug"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// BenchmarkEngineDecodeStep times one decode step of GPT-2 124M's shape
// (random weights: speed does not depend on them) with seqs sequences of
// 16-token prompts already prefilled, float32 and bfloat16 packed weights.
// tokens/s counts the step's tokens; GB/s the packed weight bytes read.
func BenchmarkEngineDecodeStep(b *testing.B) {
	cfg, err := gpt.Preset("gpt2-small")
	if err != nil {
		b.Fatal(err)
	}
	cfg.InitMethodStd = 0.02
	m, err := gpt.New(cfg, tensor.NewRNG(1))
	if err != nil {
		b.Fatal(err)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	for _, bf16 := range []bool{false, true} {
		if bf16 {
			m.RoundToBF16()
		}
		for _, seqs := range []int{1, 8, 32} {
			name := fmt.Sprintf("fp32/seqs%d", seqs)
			if bf16 {
				name = fmt.Sprintf("bf16/seqs%d", seqs)
			}
			b.Run(name, func(b *testing.B) {
				e, err := NewEngine(m, EngineConfig{BF16: bf16, KVCacheBytes: 768 << 20, MaxNumSeqs: 64, MaxNumBatchedTokens: 1024})
				if err != nil {
					b.Fatal(err)
				}
				fill := func() { // seqs new sequences, prefilled
					for i := range seqs {
						if _, err := e.Add(Request{Prompt: testPrompt(16, i, cfg.VocabSize), MaxTokens: 1000, Sampling: Sampling{TopK: 1}}); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := e.Step(); err != nil {
						b.Fatal(err)
					}
				}
				fill()
				steps := 0
				for b.Loop() {
					if _, err := e.Step(); err != nil {
						b.Fatal(err)
					}
					if steps++; steps == 100 { // keep positions bounded: restart
						b.StopTimer()
						for id := range e.byID {
							e.Cancel(id)
						}
						e.Step()
						fill()
						steps = 0
						b.StartTimer()
					}
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(seqs)/sec, "tokens/s")
				b.ReportMetric(float64(e.PackedWeightBytes())/sec/1e9, "GB/s")
			})
		}
	}
}
