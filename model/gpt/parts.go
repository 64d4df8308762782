package gpt

import "github.com/gotron/gotron/tensor"

// AttentionCore is the attention of one layer's queries over keys and
// values, the part of the layer that differs most between runs: the fused
// causal kernel in training (causalAttention), a KV cache in decoding
// (attenderCore over an Attender). Context parallelism keeps the training
// core and swaps its kernel for Model.ContextParallel's. q is
// (b, t, heads, d), k and v are (b, t, query groups, d), RoPE applied; it
// returns (b, t, heads, d). layer is the global layer index.
type AttentionCore interface {
	Attend(tp *tensor.Tape, layer int, q, k, v *tensor.Tensor) *tensor.Tensor
}

// Linears computes the model's linear layers, x·wᵀ + b for one of the
// model's weights w (b may be nil), in place of tensor.Tape.Linear: a server
// keeps the weights in a layout or precision made for decoding (infer's
// packed weights). Tensor parallelism stays outside it (Sharding).
type Linears interface {
	Linear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor
}

// tapeLinear is the default Linears: the tape's own product.
type tapeLinear struct{}

func (tapeLinear) Linear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	return tp.Linear(x, w, b)
}

// attenderCore is the AttentionCore of decoding: the Attender stores the
// new keys and values and attends each query over its sequence's cache.
// qScale (0: none) multiplies the queries first, for a model whose softmax
// scale is not the Attender's 1/√(head dim): qScale·(1/√d) is its scale.
type attenderCore struct {
	att    Attender
	qScale float32
}

func (c attenderCore) Attend(tp *tensor.Tape, layer int, q, k, v *tensor.Tensor) *tensor.Tensor {
	b, t, heads, d := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	if c.qScale != 0 {
		q = tp.Scale(q, c.qScale)
	}
	n, g := b*t, k.Dim(2)
	o := tp.EmptyLike(q, b, t, heads, d)
	tensor.Zero(o) // Attend's contract: out is zeroed
	c.att.Attend(layer, tp.Reshape(q, n, heads, d), tp.Reshape(k, n, g, d), tp.Reshape(v, n, g, d), tp.Reshape(o, n, heads, d))
	return o
}

// ContextParallel is attention over a context-parallel group (package
// parallel/cp): the layer's q, k, v hold this rank's two chunks of the
// sequence, and Attention returns this rank's rows of the whole sequence's
// attention, with tensor.Tape.Attention's options. The rest of the layer is
// per token and runs on the local chunks as it is; the batch carries the
// tokens' sequence positions (for learned and rotary positions).
type ContextParallel interface {
	Attention(tp *tensor.Tape, q, k, v *tensor.Tensor, o tensor.AttentionOptions) *tensor.Tensor
	// Dropout is tensor.Tape.Dropout of x (b, t, h), this rank's tokens,
	// with the mask the whole sequence would draw from rng: this rank's
	// rows of it, the stream advanced as for the whole sequence.
	Dropout(tp *tensor.Tape, x *tensor.Tensor, p float32, rng *tensor.RNG) *tensor.Tensor
}
