package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/half"
	"github.com/gotron/gotron/tensor"
)

// KVCache holds each attention layer's keys and values, and each gated
// delta net layer's recurrent state, for incremental decoding of one
// sequence: per attention layer one block of a paged pool, (1, groups,
// MaxLen, head dim), so a server's paged attention (tensor.PagedAttention)
// computes it, and a sequence decodes alone exactly as it does served.
type KVCache struct {
	k, v   []*tensor.Tensor // nil at gated delta net layers
	gdn    *GDNState        // the gated delta net layers' state (nil: none)
	Len    int              // positions filled
	MaxLen int
}

// NewKVCache allocates a cache for up to maxLen positions.
func (m *Model) NewKVCache(maxLen int) *KVCache {
	c := m.Config
	if (m.PosEmb != nil || m.rope != nil) && maxLen > c.MaxPositionEmbeddings {
		maxLen = c.MaxPositionEmbeddings
	}
	kv := &KVCache{MaxLen: maxLen}
	// A tensor-parallel rank caches its heads, a pipeline stage
	// (Stage.DecodeModel) its layers.
	g := m.QueryGroupsHere()
	d := m.KVHeadDim()
	kv.gdn = m.NewGDNState()
	for _, l := range m.Layers {
		if l.GDN != nil {
			kv.k, kv.v = append(kv.k, nil), append(kv.v, nil)
			continue
		}
		k := tensor.ZerosOn(m.Device(), 1, g, maxLen, d)
		v := k // cached MLA latents are the keys and the values
		if !m.SharedKV() {
			v = tensor.ZerosOn(m.Device(), 1, g, maxLen, d)
		}
		kv.k, kv.v = append(kv.k, k), append(kv.v, v)
	}
	return kv
}

// Decode runs tokens (the next positions of the cached sequence) through the
// model without gradients, appends their keys and values to the cache, and
// returns the logits of the last one (V), read back to the host. Prefill is
// Decode of the prompt.
func (m *Model) Decode(kv *KVCache, tokens []int32) ([]float32, error) {
	logits, err := m.DecodeLogits(kv, tokens)
	if err != nil {
		return nil, err
	}
	return tensor.ToHost(logits).Float32s(), nil
}

// DecodeLogits is Decode leaving the logits (1, V) on the model's device,
// for a sampler that draws there. It is DecodeBatch of one sequence over the
// contiguous cache.
func (m *Model) DecodeLogits(kv *KVCache, tokens []int32) (*tensor.Tensor, error) {
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
	logits, err := m.DecodeBatch(nil, tokens, pos, &cacheAttender{kv: kv, p0: p0, n: n}, []int{n - 1}, nil)
	if err != nil {
		return nil, err
	}
	kv.Len += n
	return logits, nil
}

// cacheAttender is the Attender of one sequence's contiguous KVCache for a
// run of new tokens from position p0: the paged ops' case of one sequence
// whose block table is the cache's single block.
type cacheAttender struct {
	kv    *KVCache
	p0, n int
}

func (a *cacheAttender) Attend(layer int, q, k, v, out *tensor.Tensor) {
	n := q.Dim(0)
	slots := make([]int32, n)
	for i := range slots {
		slots[i] = int32(a.p0 + i)
	}
	kc, vc := a.kv.k[layer], a.kv.v[layer]
	dev := kc.Device()
	tensor.PagedKVWrite(kc, vc, k, v, tensor.FromInt32(slots, n).ToDevice(dev))
	tensor.PagedAttention(out, q, kc, vc, tensor.PagedAttentionConfig{
		BlockTables: tensor.FromInt32([]int32{0}, 1, 1).ToDevice(dev),
		Spans:       tensor.FromInt32([]int32{0, int32(n), int32(a.p0)}, 1, 3).ToDevice(dev),
	})
}

// GDNRuns is the one sequence's run of new tokens and its state.
func (a *cacheAttender) GDNRuns(layer int) []GDNRun {
	return []GDNRun{a.kv.gdn.Run(layer, a.n)}
}

// RoundToBF16 rounds every parameter of m to bfloat16 (to nearest even),
// in place, keeping float32 storage: decoding with `--bf16` computes in
// float32 on bf16 weights, as a model stored in bf16 and widened on load
// would (whose weights this leaves unchanged). Parameters on a device are
// rounded through a host copy: a load-time transform, like reading a
// checkpoint.
func (m *Model) RoundToBF16() {
	for _, p := range m.Params() {
		h := tensor.ToHost(p)
		s := h.Float32s()
		for i, v := range s {
			s[i] = half.BFloat16From(v).Float32()
		}
		if h != p {
			tensor.Copy(p, h)
		}
	}
}

// CheckBF16 returns an error naming the first parameter that holds a value
// bfloat16 cannot represent exactly (see RoundToBF16).
func (m *Model) CheckBF16() error {
	for _, p := range m.Params() {
		for i, v := range tensor.ToHost(p).Float32s() {
			if math.Float32bits(v)&0xFFFF != 0 && !math.IsNaN(float64(v)) {
				return fmt.Errorf("gpt: parameter %s element %d = %g is not a bfloat16 value (round the model with RoundToBF16)", p.Name, i, v)
			}
		}
	}
	return nil
}
