package tensor

import (
	"fmt"
	"math"
	"testing"
)

// TestAttentionHeadChunksMatchWholeCall runs the head-chunked attention
// (attention_heads.go, which the CUDA backend uses for head dimensions
// above its flash kernels') on the CPU backend against the whole call: out,
// lse and the accumulated dq, dk, dv bit for bit, for chunks that divide the
// heads and chunks that do not, grouped-query attention (chunks of whole
// key-value groups), causal and full, document masks, dropout keyed by a
// first head other than 0, and a forward merging into a partial result.
// Head dimension 24 (the code does not depend on it); unequal heads and
// chunk sizes check every view's offset.
func TestAttentionHeadChunksMatchWholeCall(t *testing.T) {
	be := cpuBackend{}
	for _, c := range []struct {
		hq, hkv, hc    int
		causal, docs   bool
		dropout        float32
		first          int
		accumulateFrom bool
	}{
		{hq: 6, hkv: 6, hc: 2, causal: true},
		{hq: 5, hkv: 5, hc: 2, causal: false, dropout: 0.2, first: 3},
		{hq: 8, hkv: 4, hc: 4, causal: true, docs: true},
		{hq: 6, hkv: 2, hc: 3, causal: true, dropout: 0.1, first: 6},
		{hq: 4, hkv: 4, hc: 1, causal: true, accumulateFrom: true},
	} {
		t.Run(fmt.Sprintf("hq%d-hkv%d-chunk%d", c.hq, c.hkv, c.hc), func(t *testing.T) {
			B, T, D := 2, 7, 24
			rng := NewRNG(uint64(c.hq*100 + c.hc))
			rnd := func(shape ...int) *Tensor {
				x := Zeros(shape...)
				rng.Normal(x.Float32s(), 0, 1)
				return x
			}
			cfg := AttentionConfig{B: B, T: T, HQ: c.hq, HKV: c.hkv, D: D, Scale: 0.3, Causal: c.causal,
				Dropout: c.dropout, DropoutSeed: 11, FirstHead: c.first}
			if c.docs {
				ids := make([]int32, B*T)
				for i := range ids {
					ids[i] = int32(i % T / 3)
				}
				cfg.DocIDs = FromInt32(ids, B, T)
			}
			q, k, v := rnd(B, T, c.hq, D), rnd(B, T, c.hkv, D), rnd(B, T, c.hkv, D)
			outW, lseW := Zeros(B, T, c.hq, D), Zeros(B, c.hq, T)
			outC, lseC := Zeros(B, T, c.hq, D), Zeros(B, c.hq, T)
			if c.accumulateFrom { // a partial result over other keys to merge into
				be.AttentionForward(outW, lseW, rnd(B, T, c.hq, D), k, v, cfg)
				copy(outC.Float32s(), outW.Float32s())
				copy(lseC.Float32s(), lseW.Float32s())
				cfg.Accumulate = true
			}
			be.AttentionForward(outW, lseW, q, k, v, cfg)
			attentionForwardByHeads(be, outC, lseC, q, k, v, cfg, c.hc)
			sameBitsT(t, "out", outC, outW)
			sameBitsT(t, "lse", lseC, lseW)
			if cfg.Accumulate {
				return // the backward takes whole results
			}
			dout := rnd(B, T, c.hq, D)
			dqW, dkW, dvW := rnd(B, T, c.hq, D), rnd(B, T, c.hkv, D), rnd(B, T, c.hkv, D) // accumulated into
			dqC, dkC, dvC := Zeros(dqW.shape...), Zeros(dkW.shape...), Zeros(dvW.shape...)
			copy(dqC.Float32s(), dqW.Float32s())
			copy(dkC.Float32s(), dkW.Float32s())
			copy(dvC.Float32s(), dvW.Float32s())
			be.AttentionBackward(dqW, dkW, dvW, dout, q, k, v, outW, lseW, cfg)
			attentionBackwardByHeads(be, dqC, dkC, dvC, dout, q, k, v, outW, lseW, cfg, c.hc)
			sameBitsT(t, "dq", dqC, dqW)
			sameBitsT(t, "dk", dkC, dkW)
			sameBitsT(t, "dv", dvC, dvW)
		})
	}
}

func sameBitsT(t *testing.T, what string, got, want *Tensor) {
	t.Helper()
	g, w := got.Float32s(), want.Float32s()
	for i := range w {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			t.Fatalf("%s[%d] = %v by head chunks, %v by the whole call", what, i, g[i], w[i])
		}
	}
}

// TestAttnHeadChunk: chunks hold whole key-value groups and fit the limit;
// the CUDA backend takes the chunked path only when switched on, for head
// dimensions above the flash kernels' and whole-sequence calls whose
// scores exceed the materialized limit.
func TestAttnHeadChunk(t *testing.T) {
	perHead := int64(100 * 100 * 4)
	for _, c := range []struct {
		hq, hkv int
		limit   int64
		want    int
	}{
		{16, 16, 5 * perHead, 5},
		{16, 16, 40 * perHead, 16},
		{16, 4, 9 * perHead, 8},
		{16, 4, 3 * perHead, 0},
		{16, 16, perHead - 1, 0},
	} {
		if got := attnHeadChunk(AttentionConfig{B: 2, T: 100, HQ: c.hq, HKV: c.hkv, D: 192}, c.limit); got != c.want {
			t.Errorf("HQ=%d HKV=%d limit %d: %d heads a chunk, want %d", c.hq, c.hkv, c.limit, got, c.want)
		}
	}
	big := AttentionConfig{B: 1, T: 4096, HQ: 128, HKV: 128, D: 192} // DeepSeek-V3's 128 heads: 8 GiB of scores
	defer SetCUDAAttentionHeadChunks(SetCUDAAttentionHeadChunks(false))
	if got := attnByHeads(big); got != 0 {
		t.Errorf("head chunks off: %d", got)
	}
	SetCUDAAttentionHeadChunks(true)
	if got := attnByHeads(big); got != 16 { // 1 GiB / (4096²·4)
		t.Errorf("DeepSeek-V3 shape: %d heads a chunk, want 16", got)
	}
	for _, c := range []AttentionConfig{
		{B: 1, T: 4096, HQ: 128, HKV: 128, D: 128},           // the flash kernels take it
		{B: 1, T: 64, HQ: 128, HKV: 128, D: 192},             // the materialized path takes it whole
		{B: 1, T: 4096, HQ: 128, HKV: 128, D: 192, KPos: 64}, // block attention
	} {
		if got := attnByHeads(c); got != 0 {
			t.Errorf("%+v: %d heads a chunk, want the call whole", c, got)
		}
	}
}
