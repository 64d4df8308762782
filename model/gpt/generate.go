package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/half"
	"github.com/gotron/gotron/tensor"
)

// KVCache holds each layer's keys and values for incremental decoding of one
// sequence: (MaxLen, groups, head dim) per layer.
type KVCache struct {
	k, v   [][]float32
	Len    int // positions filled
	MaxLen int
}

// NewKVCache allocates a cache for up to maxLen positions.
func (m *Model) NewKVCache(maxLen int) *KVCache {
	c := m.Config
	if (m.PosEmb != nil || m.rope != nil) && maxLen > c.MaxPositionEmbeddings {
		maxLen = c.MaxPositionEmbeddings
	}
	kv := &KVCache{MaxLen: maxLen}
	per := maxLen * c.NumQueryGroups * c.KVChannels
	for range c.NumLayers {
		kv.k = append(kv.k, make([]float32, per))
		kv.v = append(kv.v, make([]float32, per))
	}
	return kv
}

// Decode runs tokens (the next positions of the cached sequence) through the
// model without gradients, appends their keys and values to the cache, and
// returns the logits of the last one (V). Prefill is Decode of the prompt.
func (m *Model) Decode(kv *KVCache, tokens []int32) ([]float32, error) {
	c := &m.Config
	n, p0 := len(tokens), kv.Len
	if n == 0 {
		return nil, fmt.Errorf("gpt: decode of no tokens")
	}
	if p0+n > kv.MaxLen {
		return nil, fmt.Errorf("gpt: sequence of %d tokens exceeds the cache of %d positions (--max-position-embeddings)", p0+n, kv.MaxLen)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("gpt: token id %d outside the vocabulary of %d", t, c.VocabSize)
		}
	}
	var tp *tensor.Tape // no gradients
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(p0 + i)
	}
	positions := tensor.FromInt32(pos, 1, n)
	x := tp.Embedding(tensor.FromInt32(append([]int32(nil), tokens...), 1, n), m.WordEmb) // (1, n, h)
	if m.PosEmb != nil {
		x = tp.Add(x, tp.Embedding(positions, m.PosEmb))
	}
	g, r, d := c.NumQueryGroups, c.NumAttentionHeads/c.NumQueryGroups, c.KVChannels
	for li := range m.Layers {
		l := &m.Layers[li]
		h := m.norm(tp, x, l.InputNorm, l.InputNormBias)
		qkv := tp.Reshape(tp.Linear(h, l.QKV, l.QKVBias), 1, n, g, (r+2)*d)
		parts := tp.Split(qkv, 3, r*d, d, d)
		q := tp.Reshape(parts[0], 1, n, g*r, d)
		k := tp.Reshape(parts[1], 1, n, g, d)
		v := tp.Contiguous(parts[2])
		if m.rope != nil {
			q = tp.RoPE(q, m.rope, positions)
			k = tp.RoPE(k, m.rope, positions)
		}
		copy(kv.k[li][p0*g*d:], k.Float32s())
		copy(kv.v[li][p0*g*d:], v.Float32s())
		o := cachedAttention(q.Float32s(), kv.k[li], kv.v[li], n, p0, g, r, d)
		a := tp.Linear(tensor.FromFloat32(o, 1, n, g*r*d), l.Proj, l.ProjBias)
		x = tp.Add(x, a)
		x = tp.Add(x, m.mlp(tp, l, m.norm(tp, x, l.MLPNorm, l.MLPNormBias)))
	}
	kv.Len += n
	last := tp.Narrow(x, 1, n-1, 1) // (1, 1, h)
	last = m.norm(tp, tp.Contiguous(last), m.FinalNorm, m.FinalNormB)
	out := m.OutputLayer
	if out == nil {
		out = m.WordEmb
	}
	return tp.Linear(last, out, nil).Float32s(), nil
}

// cachedAttention: query i (position p0+i) attends to cached positions
// 0..p0+i. q (n, g·r, d); caches (len, g, d); returns (n, g·r, d). Scores
// are accumulated in float64 (cpu.DotsF64), weighted by cpu.SoftmaxWeights
// and values summed in float32 (cpu.Axpys), in position order: infer's
// paged attention computes the same, so a served sequence decodes exactly
// as this one.
func cachedAttention(q, kc, vc []float32, n, p0, g, r, d int) []float32 {
	out := make([]float32, n*g*r*d)
	scale := 1 / math.Sqrt(float64(d))
	scores, w := make([]float64, p0+n), make([]float32, p0+n)
	for i := range n {
		for h := range g * r {
			kvh := h / r
			qi := q[(i*g*r+h)*d : (i*g*r+h+1)*d]
			limit := p0 + i + 1
			cpu.DotsF64(scores[:limit], qi, kc[kvh*d:], g*d, scale)
			cpu.SoftmaxWeights(w[:limit], scores[:limit])
			cpu.Axpys(out[(i*g*r+h)*d:(i*g*r+h+1)*d], vc[kvh*d:], g*d, w[:limit])
		}
	}
	return out
}

// RoundToBF16 rounds every parameter of m to bfloat16 (to nearest even),
// in place, keeping float32 storage: decoding with `--bf16` computes in
// float32 on bf16 weights, as a model stored in bf16 and widened on load
// would (whose weights this leaves unchanged).
func (m *Model) RoundToBF16() {
	for _, p := range m.Params() {
		s := p.Float32s()
		for i, v := range s {
			s[i] = half.BFloat16From(v).Float32()
		}
	}
}

// CheckBF16 returns an error naming the first parameter that holds a value
// bfloat16 cannot represent exactly (see RoundToBF16).
func (m *Model) CheckBF16() error {
	for _, p := range m.Params() {
		for i, v := range p.Float32s() {
			if math.Float32bits(v)&0xFFFF != 0 && !math.IsNaN(float64(v)) {
				return fmt.Errorf("gpt: parameter %s element %d = %g is not a bfloat16 value (round the model with RoundToBF16)", p.Name, i, v)
			}
		}
	}
	return nil
}
