package gpt

import (
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestDecodeMatchesFullForward: incremental decoding with the KV cache gives
// the same last-position logits as a full forward over the whole sequence,
// for GPT-2-style and Llama-style (RoPE, GQA) models.
func TestDecodeMatchesFullForward(t *testing.T) {
	for _, preset := range []string{"gpt2", "llama"} {
		t.Run(preset, func(t *testing.T) {
			g := loadGolden(t, preset)
			m, bt := newGoldenModel(t, g)
			tokens := bt.Tokens.Int32s()[:8]
			kv := m.NewKVCache(8)
			var got []float32
			var err error
			if got, err = m.Decode(kv, tokens[:3]); err != nil { // prefill
				t.Fatal(err)
			}
			for i := 3; i < 8; i++ {
				if got, err = m.Decode(kv, tokens[i:i+1]); err != nil {
					t.Fatal(err)
				}
			}
			full := m.Forward(nil, Batch{Tokens: tensor.FromInt32(append([]int32(nil), tokens...), 1, 8)}, nil, false)
			want := full.Float32s()[7*m.Config.VocabSize:]
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
					t.Fatalf("logit %d: decode %v, full forward %v", i, got[i], want[i])
				}
			}
			if _, err := m.Decode(kv, tokens[:1]); err == nil {
				t.Fatal("decode past the cache size did not fail")
			}
		})
	}
}
