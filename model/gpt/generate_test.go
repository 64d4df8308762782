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

// TestDecodeBatchBuffers: DecodeBatch with one DecodeBuffers reused call
// after call — chunks of 3, 1, 2, 1 and 1 tokens, so the buffers serve
// changing shapes — gives Decode's logits bit for bit, and the logits of
// several rows, for GPT-2- and Llama-style models.
func TestDecodeBatchBuffers(t *testing.T) {
	for _, preset := range []string{"gpt2", "llama"} {
		t.Run(preset, func(t *testing.T) {
			g := loadGolden(t, preset)
			m, bt := newGoldenModel(t, g)
			c := m.Config
			tokens := bt.Tokens.Int32s()[:8]
			kv := m.NewKVCache(8)
			batched := m.NewKVCache(8) // DecodeBatch's own cache
			var buf DecodeBuffers
			p := 0
			for _, n := range []int{3, 1, 2, 1, 1} {
				want, err := m.Decode(kv, tokens[p:p+n])
				if err != nil {
					t.Fatal(err)
				}
				pos := make([]int32, n)
				for i := range pos {
					pos[i] = int32(p + i)
				}
				rows := []int{n - 1}
				if n > 1 {
					rows = []int{0, n - 1}
				}
				got, err := m.DecodeBatch(&buf, tokens[p:p+n], pos, &cacheAttender{kv: batched, p0: p}, rows, nil)
				batched.Len += n
				if err != nil {
					t.Fatal(err)
				}
				V := c.VocabSize
				last := got.Float32s()[(len(rows)-1)*V:]
				for i := range want {
					if math.Float32bits(last[i]) != math.Float32bits(want[i]) {
						t.Fatalf("chunk of %d at %d: logit %d: DecodeBatch %v, Decode %v", n, p, i, last[i], want[i])
					}
				}
				p += n
			}
			if _, err := m.Decode(kv, tokens[:1]); err == nil {
				t.Fatal("decode past the model's positions did not fail")
			}
		})
	}
}
