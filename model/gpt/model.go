// Package gpt is Megatron's GPTModel in one file: word (and optional learned
// position) embeddings, pre-norm transformer layers with fused-QKV attention
// and an MLP, a final norm and a tied or untied output layer. Llama is not a
// copy: RoPE, GQA, SwiGLU and RMSNorm are Config fields. Parameter names are
// Megatron core's (decoder.layers.N.self_attention.linear_qkv.weight, ...),
// and their layouts are Megatron's: QKV rows grouped per query group, SwiGLU
// fc1 rows [gate; up]. The model holds no parallelism code.
package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
)

// Layer is one transformer layer's parameters.
type Layer struct {
	InputNorm, InputNormBias *tensor.Tensor // input_layernorm (bias nil for RMSNorm)
	QKV, QKVBias             *tensor.Tensor // self_attention.linear_qkv: (G·(r+2)·d, h)
	Proj, ProjBias           *tensor.Tensor // self_attention.linear_proj: (h, a·d)
	MLPNorm, MLPNormBias     *tensor.Tensor // pre_mlp_layernorm
	FC1, FC1Bias             *tensor.Tensor // mlp.linear_fc1: (ffn or 2·ffn, h)
	FC2, FC2Bias             *tensor.Tensor // mlp.linear_fc2: (h, ffn)
}

// Model is a GPT-family language model.
type Model struct {
	Config      Config
	WordEmb     *tensor.Tensor // embedding.word_embeddings.weight (V, h)
	PosEmb      *tensor.Tensor // embedding.position_embeddings.weight (P, h), learned_absolute only
	Layers      []Layer
	FinalNorm   *tensor.Tensor // decoder.final_layernorm.weight
	FinalNormB  *tensor.Tensor // decoder.final_layernorm.bias (LayerNorm only)
	OutputLayer *tensor.Tensor // output_layer.weight (V, h); nil when tied
	rope        *cpu.RoPE

	// Sharding is set by a parallelism plan (Parallelize) on a model whose
	// parameters are one tensor-parallel rank's slices; nil is one rank.
	Sharding Sharding
	// Recompute is activation recomputation (recompute.go); zero keeps all.
	Recompute Recompute
}

// New builds a model with Megatron's initialisation drawn from rng: weights
// normal(0, std), output projections normal(0, std/sqrt(2L)), biases zero,
// norm weights one. Each parameter draws from its own stream forked by name,
// so the values do not depend on creation order.
func New(cfg Config, rng *tensor.RNG) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Config: cfg}
	h, d, a, g := cfg.HiddenSize, cfg.KVChannels, cfg.NumAttentionHeads, cfg.NumQueryGroups
	std := cfg.InitMethodStd
	outStd := std / float32(math.Sqrt(2*float64(cfg.NumLayers)))
	normal := func(name string, s float32, shape ...int) *tensor.Tensor {
		p := tensor.Param(name, shape...)
		rng.Fork(name).Normal(p.Float32s(), 0, s)
		return p
	}
	ones := func(name string, n int) *tensor.Tensor {
		p := tensor.Param(name, n)
		for i := range p.Float32s() {
			p.Float32s()[i] = 1
		}
		return p
	}
	bias := func(name string, n int, on bool) *tensor.Tensor {
		if !on {
			return nil
		}
		return tensor.Param(name, n)
	}
	ln := cfg.Normalization == "LayerNorm"
	hasBias := !cfg.DisableBiasLinear
	fc1Rows := cfg.FFNHiddenSize
	if cfg.Activation == "swiglu" {
		fc1Rows *= 2
	}
	m.WordEmb = normal("embedding.word_embeddings.weight", std, cfg.VocabSize, h)
	if cfg.PositionEmbeddingType == "learned_absolute" {
		m.PosEmb = normal("embedding.position_embeddings.weight", std, cfg.MaxPositionEmbeddings, h)
	}
	for i := range cfg.NumLayers {
		p := fmt.Sprintf("decoder.layers.%d.", i)
		m.Layers = append(m.Layers, Layer{
			InputNorm:     ones(p+"input_layernorm.weight", h),
			InputNormBias: bias(p+"input_layernorm.bias", h, ln),
			QKV:           normal(p+"self_attention.linear_qkv.weight", std, g*(a/g+2)*d, h),
			QKVBias:       bias(p+"self_attention.linear_qkv.bias", g*(a/g+2)*d, hasBias || cfg.AddQKVBias),
			Proj:          normal(p+"self_attention.linear_proj.weight", outStd, h, a*d),
			ProjBias:      bias(p+"self_attention.linear_proj.bias", h, hasBias),
			MLPNorm:       ones(p+"pre_mlp_layernorm.weight", h),
			MLPNormBias:   bias(p+"pre_mlp_layernorm.bias", h, ln),
			FC1:           normal(p+"mlp.linear_fc1.weight", std, fc1Rows, h),
			FC1Bias:       bias(p+"mlp.linear_fc1.bias", fc1Rows, hasBias),
			FC2:           normal(p+"mlp.linear_fc2.weight", outStd, h, cfg.FFNHiddenSize),
			FC2Bias:       bias(p+"mlp.linear_fc2.bias", h, hasBias),
		})
	}
	m.FinalNorm = ones("decoder.final_layernorm.weight", h)
	m.FinalNormB = bias("decoder.final_layernorm.bias", h, ln)
	if cfg.UntieEmbeddingsAndOutputWeights {
		m.OutputLayer = normal("output_layer.weight", std, cfg.VocabSize, h)
	}
	if cfg.PositionEmbeddingType == "rope" {
		style := cpu.RotateHalf
		if cfg.RotaryInterleaved {
			style = cpu.Interleaved
		}
		r, err := cpu.NewRoPE(cpu.RoPEConfig{Dim: cfg.RotaryDim(), Base: cfg.RotaryBase, MaxPositions: cfg.MaxPositionEmbeddings, Style: style})
		if err != nil {
			return nil, err
		}
		m.rope = r
	}
	return m, nil
}

// Params returns every parameter in a fixed order (the checkpoint order).
func (m *Model) Params() []*tensor.Tensor {
	ps := []*tensor.Tensor{m.WordEmb, m.PosEmb}
	for i := range m.Layers {
		l := &m.Layers[i]
		ps = append(ps, l.InputNorm, l.InputNormBias, l.QKV, l.QKVBias, l.Proj, l.ProjBias,
			l.MLPNorm, l.MLPNormBias, l.FC1, l.FC1Bias, l.FC2, l.FC2Bias)
	}
	ps = append(ps, m.FinalNorm, m.FinalNormB, m.OutputLayer)
	out := ps[:0]
	for _, p := range ps {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// NumParams counts parameters (tied weights once).
func (m *Model) NumParams() int {
	n := 0
	for _, p := range m.Params() {
		n += p.Numel()
	}
	return n
}

// Batch is one micro-batch: tokens (b, t) and optional per-token data.
type Batch struct {
	Tokens    *tensor.Tensor // int32 (b, t)
	Positions *tensor.Tensor // int32 (b, t); nil means 0..t-1 (--reset-position-ids gives others)
	DocIDs    *tensor.Tensor // int32 (b, t); non-nil masks attention across documents (--reset-attention-mask)
	Labels    *tensor.Tensor // int32 (b, t), for Loss
	LossMask  *tensor.Tensor // float32 (b, t), for Loss; nil weighs every token 1
}

// Forward returns logits (b, t, V). rng draws dropout masks (nil when both
// dropouts are zero, or in evaluation with training=false).
func (m *Model) Forward(tp *tensor.Tape, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	x := m.embed(tp, bt, rng, training)
	x = m.layers(tp, x, bt, rng, training) // recompute.go: with or without activation recomputation
	x = m.norm(tp, x, m.FinalNorm, m.FinalNormB)
	out := m.OutputLayer
	if out == nil {
		out = m.WordEmb
	}
	return tp.Linear(m.enterColumn(tp, x), out, nil) // (b, t, V), or this rank's V/TP
}

// embed is the first part of Model.Forward: word (and position)
// embeddings, then dropout.
func (m *Model) embed(tp *tensor.Tape, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	b, t := bt.Tokens.Dim(0), bt.Tokens.Dim(1)
	sh := m.Sharding
	var x *tensor.Tensor
	if sh == nil {
		x = tp.Embedding(bt.Tokens, m.WordEmb) // (b, t, h)
	} else { // vocab-parallel; sequence shards (b, t/TP, h) with SP and no position table
		x = sh.WordEmbedding(tp, bt.Tokens, m.WordEmb, m.PosEmb == nil)
	}
	if m.PosEmb != nil {
		pos := bt.Positions
		if pos == nil {
			pos = defaultPositions(b, t)
		}
		x = tp.Add(x, tp.Embedding(pos, m.PosEmb))
		if sh != nil {
			x = sh.ScatterSequence(tp, x) // identity without SP
		}
	}
	return m.dropout(tp, x, m.Config.HiddenDropout, m.rngOutsideTP(rng), training)
}

// enterColumn is the input of a column-parallel linear: copy-to-TP, or the
// sequence all-gather with SP (identity on one rank).
func (m *Model) enterColumn(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if m.Sharding == nil {
		return x
	}
	return m.Sharding.EnterColumn(tp, x)
}

// rowLinear is x·wᵀ + b for a row-parallel linear: the partial products are
// reduced across TP ranks (reduce-scattered with SP) before the bias.
func (m *Model) rowLinear(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	if m.Sharding == nil {
		return tp.Linear(x, w, b)
	}
	y := m.Sharding.ExitRow(tp, tp.Linear(x, w, nil))
	if b != nil {
		y = tp.Add(y, b)
	}
	return y
}

// rngOutsideTP is the dropout stream of replicated activations (Megatron's
// default stream; with SP, activations are sequence shards and draw from
// the per-rank stream, as Megatron's model-parallel RNG tracker).
func (m *Model) rngOutsideTP(rng *tensor.RNG) *tensor.RNG {
	if m.Sharding == nil || rng == nil {
		return rng
	}
	return m.Sharding.DropoutRNG(rng, m.Sharding.SequenceParallel())
}

// layer is x + drop(attn(norm1(x))), then + drop(mlp(norm2(x))).
func (m *Model) layer(tp *tensor.Tape, l *Layer, x *tensor.Tensor, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	c := &m.Config
	a := m.attention(tp, l, m.norm(tp, x, l.InputNorm, l.InputNormBias), bt, rng, training)
	x = tp.Add(x, m.dropout(tp, a, c.HiddenDropout, m.rngOutsideTP(rng), training))
	f := m.mlp(tp, l, m.norm(tp, x, l.MLPNorm, l.MLPNormBias))
	return tp.Add(x, m.dropout(tp, f, c.HiddenDropout, m.rngOutsideTP(rng), training))
}

// attention: fused QKV in Megatron's per-query-group layout, RoPE, fused
// causal attention, output projection.
func (m *Model) attention(tp *tensor.Tape, l *Layer, x *tensor.Tensor, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	c := &m.Config
	x = m.enterColumn(tp, x)
	b, t := x.Dim(0), x.Dim(1)
	// Query groups held here (all of them, or this TP rank's): from the
	// weight, so a tensor-parallel slice needs no other config.
	r, d := c.NumAttentionHeads/c.NumQueryGroups, c.KVChannels
	g := l.QKV.Dim(0) / ((r + 2) * d)
	qkv := tp.Reshape(tp.Linear(x, l.QKV, l.QKVBias), b, t, g, (r+2)*d)
	parts := tp.Split(qkv, 3, r*d, d, d)
	q := tp.Reshape(parts[0], b, t, g*r, d) // head h = j·r + i uses kv head j
	k := tp.Reshape(parts[1], b, t, g, d)
	v := tp.Reshape(parts[2], b, t, g, d)
	if m.rope != nil {
		q = tp.RoPE(q, m.rope, bt.Positions)
		k = tp.RoPE(k, m.rope, bt.Positions)
	}
	o := m.coreAttention(tp, q, k, v, bt, rng, training) // (b, t, a, d)
	return m.rowLinear(tp, tp.Reshape(o, b, t, g*r*d), l.Proj, l.ProjBias)
}

func (m *Model) mlp(tp *tensor.Tape, l *Layer, x *tensor.Tensor) *tensor.Tensor {
	h := tp.Linear(m.enterColumn(tp, x), l.FC1, l.FC1Bias)
	switch m.Config.Activation {
	case "swiglu":
		h = tp.SwiGLU(h)
	case "gelu_tanh":
		h = tp.GELU(h, tensor.GELUTanh)
	default:
		h = tp.GELU(h, tensor.GELUErf)
	}
	return m.rowLinear(tp, h, l.FC2, l.FC2Bias)
}

func (m *Model) norm(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	if m.Config.Normalization == "RMSNorm" {
		return tp.RMSNorm(x, w, m.Config.NormEpsilon)
	}
	return tp.LayerNorm(x, w, b, m.Config.NormEpsilon)
}

func (m *Model) dropout(tp *tensor.Tape, x *tensor.Tensor, p float32, rng *tensor.RNG, training bool) *tensor.Tensor {
	if !training || p == 0 || rng == nil {
		return x
	}
	return tp.Dropout(x, p, rng)
}

func defaultPositions(b, t int) *tensor.Tensor {
	p := make([]int32, b*t)
	for i := range p {
		p[i] = int32(i % t)
	}
	return tensor.FromInt32(p, b, t)
}

// Loss is the token-weighted cross-entropy Σ loss·mask / Σ mask of logits
// (b, t, V) against bt.Labels, as pretrain_gpt.py's loss_func.
func (m *Model) Loss(tp *tensor.Tape, logits *tensor.Tensor, bt Batch) *tensor.Tensor {
	n := bt.Labels.Numel()
	var mask *tensor.Tensor
	if bt.LossMask != nil {
		mask = tp.Reshape(bt.LossMask, n)
	}
	if m.Sharding != nil { // logits hold this rank's vocabulary slice
		return m.Sharding.CrossEntropy(tp, tp.Reshape(logits, n, logits.Dim(-1)), bt.Labels.Contiguous().Reshape(n), mask)
	}
	return tp.CrossEntropy(tp.Reshape(logits, n, m.Config.VocabSize), bt.Labels.Contiguous().Reshape(n), tensor.CrossEntropyOptions{LossMask: mask})
}
