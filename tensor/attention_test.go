package tensor

import (
	"slices"
	"testing"
)

// TestAttentionDropoutStream: a call with attention dropout draws exactly
// one block of its stream (the masks' key), so successive calls drop
// differently, a restored state replays the call bitwise, and activation
// recomputation (Tape.Checkpoint under the stream) gives the plain run's
// loss and gradients bitwise.
func TestAttentionDropoutStream(t *testing.T) {
	init := NewRNG(4)
	q, k, v := randParam(init, "q", 1, 2, 70, 4, 8), randParam(init, "k", 1, 2, 70, 2, 8), randParam(init, "v", 1, 2, 70, 2, 8)
	attn := func(tp *Tape, rng *RNG, p float32) *Tensor {
		return tp.Attention(q, k, v, AttentionOptions{Causal: true, Dropout: p, RNG: rng})
	}
	rng := NewRNG(9)
	plain := attn(nil, nil, 0).Float32s()
	st := rng.State()
	first := attn(nil, rng, 0.1).Float32s()
	if got := rng.State().Offset - st.Offset; got != 1 {
		t.Fatalf("attention with dropout advanced the stream by %d blocks, want 1", got)
	}
	second := attn(nil, rng, 0.1).Float32s()
	if slices.Equal(first, plain) || slices.Equal(first, second) {
		t.Fatal("attention dropout: the output equals the output without dropout, or that of the next call")
	}
	rng.SetState(st)
	if again := attn(nil, rng, 0.1).Float32s(); !slices.Equal(again, first) {
		t.Fatal("attention dropout: a restored stream does not replay the masks")
	}

	run := func(recompute bool) []float32 {
		ZeroGrad([]*Tensor{q, k, v})
		rng := NewRNG(11)
		tp := NewTape()
		f := func(tp *Tape, in []*Tensor) []*Tensor {
			// two calls: the second must see the stream where the first left it
			a := tp.Attention(in[0], in[1], in[2], AttentionOptions{Causal: true, Dropout: 0.2, RNG: rng})
			b := tp.Attention(in[0], in[1], in[2], AttentionOptions{Causal: true, Dropout: 0.2, RNG: rng, FirstHead: 4})
			return []*Tensor{tp.Mul(a, b)}
		}
		var out []*Tensor
		if recompute {
			out = tp.Checkpoint(f, []*Tensor{q, k, v}, rng)
		} else {
			out = f(tp, []*Tensor{q, k, v})
		}
		l := tp.Sum(tp.Mul(out[0], out[0]))
		if err := tp.Backward(l); err != nil {
			t.Fatal(err)
		}
		return slices.Concat(l.Float32s(), q.Grad.Float32s(), k.Grad.Float32s(), v.Grad.Float32s(), []float32{float32(rng.State().Offset)})
	}
	a, b := run(false), run(true)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("element %d of loss, gradients and stream offset: plain %v, recomputed %v", i, a[i], b[i])
		}
	}
}
