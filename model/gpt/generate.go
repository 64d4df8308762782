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
// It is DecodeBatch of one sequence over the contiguous cache.
func (m *Model) Decode(kv *KVCache, tokens []int32) ([]float32, error) {
	n, p0 := len(tokens), kv.Len
	if n == 0 {
		return nil, fmt.Errorf("gpt: decode of no tokens")
	}
	if n > kv.MaxLen-p0 {
		return nil, fmt.Errorf("gpt: sequence of %d tokens exceeds the cache of %d positions (--max-position-embeddings)", p0+n, kv.MaxLen)
	}
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(p0 + i)
	}
	logits, err := m.DecodeBatch(nil, tokens, pos, &cacheAttender{kv: kv, p0: p0, cfg: &m.Config}, []int{n - 1}, nil)
	if err != nil {
		return nil, err
	}
	kv.Len += n
	return logits, nil
}

// cacheAttender is the Attender of one sequence's contiguous KVCache for a
// run of new tokens from position p0.
type cacheAttender struct {
	kv  *KVCache
	p0  int
	cfg *Config
}

func (a *cacheAttender) Attend(layer int, q, k, v, out *tensor.Tensor) {
	c := a.cfg
	g, r, d := c.NumQueryGroups, c.NumAttentionHeads/c.NumQueryGroups, c.KVChannels
	n := q.Dim(0)
	copy(a.kv.k[layer][a.p0*g*d:], k.Float32s())
	copy(a.kv.v[layer][a.p0*g*d:], v.Float32s())
	attendCache(out.Float32s(), q.Float32s(), a.kv.k[layer], a.kv.v[layer], n, a.p0, g, r, d)
}

// attendCache: query i (position p0+i) attends to cached positions
// 0..p0+i. q (n, g·r, d); caches (len, g, d); adds into out (n, g·r, d),
// which is zeroed. Scores
// are accumulated in float64 (cpu.DotsF64), weighted by cpu.SoftmaxWeights
// and values summed in float32 (cpu.Axpys), in position order: infer's
// paged attention computes the same, so a served sequence decodes exactly
// as this one.
func attendCache(out, q, kc, vc []float32, n, p0, g, r, d int) {
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
