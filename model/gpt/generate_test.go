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

// seqAttender is a gpt.Attender for one sequence in a growing cache,
// computed by attendCache (as Decode computes it) into a fresh buffer and
// added into out, which Attend's contract says is zeroed (infer's paged
// attention accumulates into it).
type seqAttender struct {
	k, v    [][]float32
	g, r, d int
	len     int
}

func (a *seqAttender) Attend(layer int, qt, kt, vt, outt *tensor.Tensor) {
	q, k, v, out := qt.Float32s(), kt.Float32s(), vt.Float32s(), outt.Float32s()
	n := len(k) / (a.g * a.d)
	a.k[layer] = append(a.k[layer], k...)
	a.v[layer] = append(a.v[layer], v...)
	o := make([]float32, len(out))
	attendCache(o, q, a.k[layer], a.v[layer], n, a.len, a.g, a.r, a.d)
	for i := range o {
		out[i] += o[i]
	}
	if layer == len(a.k)-1 {
		a.len += n
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
			att := &seqAttender{k: make([][]float32, c.NumLayers), v: make([][]float32, c.NumLayers),
				g: c.NumQueryGroups, r: c.NumAttentionHeads / c.NumQueryGroups, d: c.KVChannels}
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
				got, err := m.DecodeBatch(&buf, tokens[p:p+n], pos, att, rows, nil)
				if err != nil {
					t.Fatal(err)
				}
				V := c.VocabSize
				last := got[(len(rows)-1)*V:]
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
