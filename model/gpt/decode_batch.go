package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// Attender is the seam between the model and a key/value cache layout for
// DecodeBatch (infer's paged cache implements it): it keeps each layer's keys
// and values and computes the attention of new queries over the positions
// their sequences have cached.
type Attender interface {
	// Attend is called once per layer, in layer order, with the new
	// tokens' queries q (n, heads, head dim) and keys and values k, v
	// (n, query groups, head dim), RoPE already applied, all contiguous. It
	// stores k and v and writes into out (n, heads, head dim), which is
	// zeroed, the causal attention of each query over its own sequence's
	// positions up to and including its own.
	Attend(layer int, q, k, v, out *tensor.Tensor)
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
// (len(rows), V) of the tokens whose indices rows lists, in that order, on
// the model's device: a server samples from them there
// (tensor.SampleTokens) and reads back only the drawn ids.
//
// lin (nil: tp.Linear on the model's weights) computes the linear layers.
// For one sequence (att attending to it alone) and lin nil the arithmetic
// is Decode's, op for op. For a model with gated delta net layers att also
// keeps their recurrent state (GDNStates). With buf (nil: every buffer from the heap) the
// logits are valid until the next call with the same buf.
func (m *Model) DecodeBatch(buf *DecodeBuffers, tokens, positions []int32, att Attender, rows []int, lin Linears) (*tensor.Tensor, error) {
	return m.decodePart(buf, decodePart{first: true, last: true}, nil, tokens, positions, att, rows, lin)
}

// DecodeBatch is Model.DecodeBatch for one pipeline stage (pipeline-parallel
// decoding): the first stage embeds tokens and ignores in; the others start
// from in, the previous stage's output (n, h) on the model's device. Every
// stage runs its layers through att, whose layer indices count from the
// stage's first layer (a stage caches its own layers' keys and values).
// The last stage returns the logits rows (len(rows), V), as
// Model.DecodeBatch; the others return the hidden states (n, h) of every
// token, for the next stage (valid until the next call with buf). The
// stages' ops are Model.DecodeBatch's, in its order, so a pipeline gives
// one process's logits. Only single-chunk stages decode (no virtual
// stages).
func (s *Stage) DecodeBatch(buf *DecodeBuffers, in *tensor.Tensor, tokens, positions []int32, att Attender, rows []int, lin Linears) (*tensor.Tensor, error) {
	if s.Chunk != 0 {
		return nil, fmt.Errorf("gpt: decoding model chunk %d of pipeline rank %d: decoding takes one chunk per rank (no virtual pipeline stages)", s.Chunk, s.Rank)
	}
	if !s.first {
		switch {
		case in == nil:
			return nil, fmt.Errorf("gpt: pipeline stage %d decodes no input: want the previous stage's hidden states", s.Rank)
		case in.NDim() != 2 || in.Dim(0) != len(tokens) || in.Dim(1) != s.Config.HiddenSize:
			return nil, fmt.Errorf("gpt: pipeline stage %d: input of shape %v for %d tokens: want [%d %d]", s.Rank, in.Shape(), len(tokens), len(tokens), s.Config.HiddenSize)
		}
	}
	var local Attender = offsetAttender{att, s.FirstLayer}
	if gs, ok := att.(GDNStates); ok {
		local = offsetGDNAttender{offsetAttender{att, s.FirstLayer}, gs}
	}
	return s.view().decodePart(buf, decodePart{first: s.first, last: s.last, firstLayer: s.FirstLayer}, in, tokens, positions, local, rows, lin)
}

// offsetGDNAttender is offsetAttender of an Attender that keeps gated delta
// net states: a stage's layers' states, numbered from its first.
type offsetGDNAttender struct {
	offsetAttender
	gs GDNStates
}

func (a offsetGDNAttender) GDNRuns(layer int) []GDNRun { return a.gs.GDNRuns(layer - a.first) }

// offsetAttender numbers a stage's layers from its first (the model's
// passes give global layer indices).
type offsetAttender struct {
	att   Attender
	first int
}

func (a offsetAttender) Attend(layer int, q, k, v, out *tensor.Tensor) {
	a.att.Attend(layer-a.first, q, k, v, out)
}

// decodePart is which part of the model a decoding call runs: the
// embedding (first), the layers from firstLayer, the head (last).
type decodePart struct {
	first, last bool
	firstLayer  int
}

func (m *Model) decodePart(buf *DecodeBuffers, part decodePart, in *tensor.Tensor, tokens, positions []int32, att Attender, rows []int, lin Linears) (*tensor.Tensor, error) {
	c := &m.Config
	if err := c.CheckDecode(); err != nil {
		return nil, err
	}
	n := len(tokens)
	switch {
	case n == 0:
		return nil, fmt.Errorf("gpt: decode of no tokens")
	case len(positions) != n:
		return nil, fmt.Errorf("gpt: %d positions for %d tokens", len(positions), n)
	case len(rows) == 0 && part.last:
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
	if buf == nil && m.Sharding != nil {
		// The tensor-parallel collectives record a failure on the tape
		// (a nil tape would panic with it): one call's buffers.
		buf = &DecodeBuffers{}
	}
	tp, lt := buf.tapes() // no gradients: the call's buffers, a layer's
	if lin == nil {
		lin = tapeLinear{}
	}
	dev := m.Device() // tokens and positions are the step's input: copied to the model's device
	posT := tensor.FromInt32(append([]int32(nil), positions...), 1, n).ToDevice(dev)
	core := attenderCore{att: att}
	if c.MLA.Enabled {
		// The paged kernels scale the scores by 1/√(head dim); MLA's heads
		// are padded to KVHeadDim and its scale is its own (YaRN's mscale²).
		core.qScale = c.MLA.SoftmaxScale() * float32(math.Sqrt(float64(m.KVHeadDim())))
	}
	p := &pass{positions: posT, core: core, lin: lin, layerTape: lt, mlaLatents: c.MLA.Enabled && m.CacheMLALatents}
	if c.GDN.Enabled {
		gs, ok := att.(GDNStates)
		if !ok {
			return nil, fmt.Errorf("gpt: decoding a model with gated delta net layers needs an Attender that keeps their state (GDNStates); %T does not", att)
		}
		start, err := m.checkGDNRuns(gs, positions, part.firstLayer)
		if err != nil {
			return nil, err
		}
		p.gdn, p.gdnStart = gs, start
	}
	var x *tensor.Tensor // (1, n, h)
	if part.first {
		x = m.embed(tp, tensor.FromInt32(append([]int32(nil), tokens...), 1, n).ToDevice(dev), posT, p)
	} else {
		x = tp.Reshape(in, 1, n, c.HiddenSize)
	}
	x = m.block(tp, x, m.Layers, part.firstLayer, p)
	if !part.last {
		if err := tp.Err(); err != nil {
			return nil, fmt.Errorf("gpt: decode: %w", err)
		}
		return tp.Reshape(tp.Contiguous(x), n, c.HiddenSize), nil
	}
	var last *tensor.Tensor // (1, len(rows), h)
	if len(rows) == 1 {
		last = tp.Contiguous(tp.Narrow(x, 1, rows[0], 1))
	} else {
		last = tp.EmptyLike(x, 1, len(rows), c.HiddenSize)
		for i, r := range rows {
			tensor.Copy(tp.Narrow(last, 1, i, 1), tp.Narrow(x, 1, r, 1))
		}
	}
	logits := m.head(tp, last, m.outputWeight(), p) // (1, rows, V), or this TP rank's V/TP
	if m.Sharding != nil {
		// every rank samples from the whole vocabulary, the same bytes
		logits = m.Sharding.GatherVocab(tp, logits)
		if err := tp.Err(); err != nil {
			return nil, fmt.Errorf("gpt: decode: %w", err)
		}
	}
	return tp.Reshape(logits, len(rows), c.VocabSize), nil
}

// DecodeModel returns a Model holding the stage's tensors only (nil where
// the stage has none: the embedding off the first stage, the final norm and
// output layer off the last), sharing them: for what a server reads of a
// model (Config, Layers, Params, Device, QueryGroupsHere). Its own Forward
// and DecodeBatch run the whole model and need a stage that is both first
// and last; a pipeline stage decodes with Stage.DecodeBatch.
func (s *Stage) DecodeModel() *Model { return s.view() }

// DropOtherStages lets go of the tensors of the full model s was split
// from (SplitStages) that s does not hold — the other stages' layers, and
// the embedding or the head off the first or last stage — so that a
// decoding rank that loaded the whole model keeps its stage's weights
// alone. The full model and its other stages are unusable afterwards; s
// keeps working (it reads only the full model's shared state).
func (s *Stage) DropOtherStages() {
	full := s.model
	lo, hi := s.FirstLayer, s.FirstLayer+len(s.Layers)
	for i := range full.Layers {
		if i < lo || i >= hi {
			full.Layers[i] = Layer{}
		}
	}
	if !s.first {
		full.WordEmb, full.PosEmb = nil, nil
	}
	if !s.last {
		full.FinalNorm, full.FinalNormB, full.OutputLayer = nil, nil, nil
	}
}

// QueryGroupsHere is the number of query groups (key/value heads) whose
// attention this rank computes: all of them, or a tensor-parallel rank's
// share (read from the QKV weight, or MLA's key-value up-projection, as the
// attention does). A KV cache holds these.
func (m *Model) QueryGroupsHere() int {
	c := &m.Config
	if m.SharedKV() {
		return 1 // cached MLA latents: the latent and rotary key are shared by every head
	}
	if m.Sharding == nil || len(m.Layers) == 0 {
		return c.NumQueryGroups
	}
	if l := m.Layers[0]; c.MLA.Enabled && l.KVUp != nil {
		return l.KVUp.Dim(0) / (c.MLA.QKHeadDim + c.MLA.VHeadDim) // MLA: one key-value head per query head
	}
	r := c.NumAttentionHeads / c.NumQueryGroups
	per := (r + 2) * c.KVChannels
	if c.AttentionOutputGate {
		per = (2*r + 2) * c.KVChannels // a gate per query head
	}
	for _, l := range m.Layers { // the first attention layer's (a gated delta net has no QKV)
		if l.QKV != nil {
			return l.QKV.Dim(0) / per
		}
	}
	return c.NumQueryGroups
}

// KVHeadDim is the width of each cached key and value head: --kv-channels,
// or with multi-latent attention the wider of the [nope; rope] query-key
// head and the value head (mlaAttention pads the narrower with zeros, and
// the cache keeps the padded heads: per head the rotary key shared by the
// heads is stored with each head's own key), or with its latents cached
// kv_lora_rank + qk_pos_emb_head_dim.
func (m *Model) KVHeadDim() int {
	c := &m.Config
	if m.SharedKV() {
		return c.MLA.KVLoraRank + c.MLA.QKPosEmbHeadDim
	}
	if c.MLA.Enabled {
		return max(c.MLA.QHeadDim(), c.MLA.VHeadDim)
	}
	return c.KVChannels
}

// KVBytesPerToken is the KV cache's size of one position on this rank:
// keys and values of every attention layer it holds (a pipeline stage its
// own; a gated delta net layer keeps a recurrent state instead,
// GDNStateBytes), float32, of the heads this rank holds; cached MLA latents
// once (they are the keys and the values).
func (m *Model) KVBytesPerToken() int64 {
	kv := int64(2)
	if m.SharedKV() {
		kv = 1
	}
	return kv * int64(len(m.Layers)-m.numGDNLayersHere()) * int64(m.QueryGroupsHere()) * int64(m.KVHeadDim()) * 4
}

// SharedKV reports whether the cache's keys and values are the same values
// (cached MLA latents serve as both, Model.CacheMLALatents): a cache keeps
// them once.
func (m *Model) SharedKV() bool { return m.Config.MLA.Enabled && m.CacheMLALatents }
