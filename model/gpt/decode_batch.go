package gpt

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// Attender is the seam between the model and a key/value cache layout for
// DecodeBatch (infer's paged cache implements it): it keeps each layer's keys
// and values and computes the attention of new queries over the positions
// their sequences have cached.
type Attender interface {
	// Attend is called once per layer, in layer order, with the new
	// tokens' queries q (n, heads, head dim) and keys and values k, v
	// (n, query groups, head dim), RoPE already applied. It stores k and v
	// and writes into out (n, heads, head dim), which is zeroed, the causal
	// attention of each query over its own sequence's positions up to and
	// including its own.
	Attend(layer int, q, k, v, out []float32)
}

// Linears computes DecodeBatch's linear layers, x·wᵀ + b for the model's
// weight w, in place of tp.Linear: a server keeps the weights in a layout
// or precision made for decoding (infer's packed weights).
type Linears interface {
	Linear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor
}

// DecodeBuffers keeps DecodeBatch's activations from one call to the next
// (the zero value is ready to use): a server decoding step after step then
// reuses the same buffers instead of allocating tens of megabytes per step,
// which fresh memory makes expensive (every new page is faulted in and
// zeroed; in a virtual machine a fault cost ~15 µs). A layer's buffers go
// back to the pool when the layer is done, so the pool holds one layer's
// activations, the residual stream and the logits. Not safe for concurrent
// use.
type DecodeBuffers struct {
	arena       *tensor.Arena
	step, layer *tensor.Tape
}

// tapes returns the tape for buffers that live through the call (nil: the
// heap) and the one for a layer's, after returning the previous call's.
func (b *DecodeBuffers) tapes() (step, layer *tensor.Tape) {
	if b == nil {
		return nil, nil
	}
	if b.arena == nil {
		b.arena = tensor.NewSizeClassArena()
		b.step, b.layer = tensor.NewNoGradTape(b.arena), tensor.NewNoGradTape(b.arena)
	}
	b.step.Reset()
	return b.step, b.layer
}

// DecodeBatch runs tokens without gradients: the next positions of several
// cached sequences, flattened sequence after sequence, token i at position
// positions[i] of its sequence. Attention goes through att; every other op
// works on each token alone, so one call serves any mix of prefill chunks
// and single decode tokens (continuous batching). It returns the logits
// (len(rows), V) of the tokens whose indices rows lists, in that order.
//
// lin (nil: tp.Linear on the model's weights) computes the linear layers.
// For one sequence (att attending to it alone) and lin nil the arithmetic
// is Decode's, op for op. With buf (nil: every buffer from the heap) the
// logits are valid until the next call with the same buf.
func (m *Model) DecodeBatch(buf *DecodeBuffers, tokens, positions []int32, att Attender, rows []int, lin Linears) ([]float32, error) {
	c := &m.Config
	n := len(tokens)
	switch {
	case n == 0:
		return nil, fmt.Errorf("gpt: decode of no tokens")
	case len(positions) != n:
		return nil, fmt.Errorf("gpt: %d positions for %d tokens", len(positions), n)
	case len(rows) == 0:
		return nil, fmt.Errorf("gpt: decode asks for no logits")
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("gpt: token id %d outside the vocabulary of %d", t, c.VocabSize)
		}
		if p := positions[i]; p < 0 || (m.PosEmb != nil || m.rope != nil) && int(p) >= c.MaxPositionEmbeddings {
			return nil, fmt.Errorf("gpt: position %d outside the model's %d positions (--max-position-embeddings)", p, c.MaxPositionEmbeddings)
		}
	}
	for _, r := range rows {
		if r < 0 || r >= n {
			return nil, fmt.Errorf("gpt: logits of row %d asked of %d tokens", r, n)
		}
	}
	tp, lt := buf.tapes() // no gradients: the call's buffers, a layer's
	linear := func(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor { return tp.Linear(x, w, b) }
	if lin != nil {
		linear = lin.Linear
	}
	posT := tensor.FromInt32(append([]int32(nil), positions...), 1, n)
	x := tp.Embedding(tensor.FromInt32(append([]int32(nil), tokens...), 1, n), m.WordEmb) // (1, n, h)
	if m.PosEmb != nil {
		x = tp.Add(x, tp.Embedding(posT, m.PosEmb))
	}
	g, r, d := c.NumQueryGroups, c.NumAttentionHeads/c.NumQueryGroups, c.KVChannels
	for li := range m.Layers {
		l := &m.Layers[li]
		h := m.norm(lt, x, l.InputNorm, l.InputNormBias)
		qkv := lt.Reshape(linear(lt, h, l.QKV, l.QKVBias), 1, n, g, (r+2)*d)
		parts := lt.Split(qkv, 3, r*d, d, d)
		q := lt.Reshape(parts[0], 1, n, g*r, d)
		k := lt.Reshape(parts[1], 1, n, g, d)
		v := lt.Contiguous(parts[2]) // (1, n, g, d)
		if m.rope != nil {
			q = lt.RoPE(q, m.rope, posT)
			k = lt.RoPE(k, m.rope, posT)
		}
		o := lt.Empty(n, g*r*d) // (n, a, d)
		clear(o.Float32s())
		att.Attend(li, q.Float32s(), k.Float32s(), v.Float32s(), o.Float32s())
		a := linear(lt, lt.Reshape(o, 1, n, g*r*d), l.Proj, l.ProjBias)
		y := lt.Add(x, a)
		y = lt.Add(y, m.decodeMLP(lt, l, m.norm(lt, y, l.MLPNorm, l.MLPNormBias), linear))
		if lt == nil {
			x = y
			continue
		}
		copy(x.Float32s(), y.Float32s()) // x lives on the call's tape
		lt.Reset()
	}
	var last *tensor.Tensor
	if len(rows) == 1 {
		last = tp.Contiguous(tp.Narrow(x, 1, rows[0], 1)) // (1, 1, h)
	} else {
		hs := c.HiddenSize
		last = tp.Empty(1, len(rows), hs)
		xs, sel := x.Float32s(), last.Float32s()
		for i, r := range rows {
			copy(sel[i*hs:(i+1)*hs], xs[r*hs:(r+1)*hs])
		}
	}
	last = m.norm(tp, last, m.FinalNorm, m.FinalNormB)
	out := m.OutputLayer
	if out == nil {
		out = m.WordEmb
	}
	return linear(tp, last, out, nil).Float32s(), nil // (len(rows), V)
}

// decodeMLP is mlp with its linear layers computed by linear.
func (m *Model) decodeMLP(tp *tensor.Tape, l *Layer, x *tensor.Tensor, linear func(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor) *tensor.Tensor {
	h := linear(tp, x, l.FC1, l.FC1Bias)
	switch m.Config.Activation {
	case "swiglu":
		h = tp.SwiGLU(h)
	case "gelu_tanh":
		h = tp.GELU(h, tensor.GELUTanh)
	default:
		h = tp.GELU(h, tensor.GELUErf)
	}
	return linear(tp, h, l.FC2, l.FC2Bias)
}
