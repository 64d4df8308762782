package tensor

import (
	"fmt"
	"slices"
)

// AttentionBlockForward runs the fused attention kernel once, outside any
// tape: q (b, t, hq, d) over k, v (b, t, hkv, d) into out (b, t, hq, d) and
// lse (b, hq, t), with cfg's block settings (QPos, KPos, Accumulate). It is
// the building block of attention whose keys arrive in pieces (ring
// attention over a context-parallel group), whose caller owns the autograd
// (a Function). cfg's shape fields are taken from q and k; all tensors
// contiguous float32 on one device.
func AttentionBlockForward(out, lse, q, k, v *Tensor, cfg AttentionConfig) {
	cfg = attentionBlockConfig("AttentionBlockForward", q, k, v, out, lse, cfg)
	backendFor(out, lse, q, k, v).AttentionForward(out, lse, q, k, v, cfg)
}

// AttentionBlockBackward accumulates the gradients of one block into dq, dk
// and dv (shapes of q, k, v): out and lse are the final output and
// log-sum-exp of q's rows over all keys (the merged result), so the
// gradients of the blocks add up to those of the whole attention.
func AttentionBlockBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig) {
	cfg = attentionBlockConfig("AttentionBlockBackward", q, k, v, out, lse, cfg)
	cfg.Accumulate = false
	for _, x := range []struct {
		name   string
		t, ref *Tensor
	}{{"dq", dq, q}, {"dk", dk, k}, {"dv", dv, v}, {"dout", dout, q}} {
		if !slices.Equal(x.t.shape, x.ref.shape) || !x.t.IsContiguous() {
			panic(fmt.Sprintf("tensor: AttentionBlockBackward: %s %v, want contiguous %v", x.name, x.t.shape, x.ref.shape))
		}
	}
	backendFor(dq, dk, dv, dout, q, k, v, out, lse).AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
}

// attentionBlockConfig checks the shapes of a block call and fills cfg's.
func attentionBlockConfig(op string, q, k, v, out, lse *Tensor, cfg AttentionConfig) AttentionConfig {
	if len(q.shape) != 4 || len(k.shape) != 4 {
		panic(fmt.Sprintf("tensor: %s: q %v, k %v: want (b, t, heads, d)", op, q.shape, k.shape))
	}
	b, t, hq, d := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	kv := []int{b, t, k.Dim(2), d}
	switch {
	case !slices.Equal(k.shape, kv) || !slices.Equal(v.shape, kv):
		panic(fmt.Sprintf("tensor: %s: k %v, v %v: want %v for q %v", op, k.shape, v.shape, kv, q.shape))
	case !slices.Equal(out.shape, q.shape) || !slices.Equal(lse.shape, []int{b, hq, t}):
		panic(fmt.Sprintf("tensor: %s: out %v, lse %v: want %v and [%d %d %d]", op, out.shape, lse.shape, q.shape, b, hq, t))
	case cfg.DocIDs != nil:
		panic(fmt.Sprintf("tensor: %s: DocIDs are not supported on blocks", op))
	}
	for _, x := range []*Tensor{q, k, v, out, lse} {
		if !x.IsContiguous() || x.dtype != Float32 {
			panic(fmt.Sprintf("tensor: %s: %v %v tensor: want contiguous float32", op, x.shape, x.dtype))
		}
	}
	cfg.B, cfg.T, cfg.HQ, cfg.HKV, cfg.D = b, t, hq, k.Dim(2), d
	return cfg
}
