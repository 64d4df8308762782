package gpt

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/tensor"
)

// The hybrid model of Megatron's --experimental-attention-variant
// gated_delta_net (Qwen3-Next style): some layers replace self-attention by
// a gated delta net (megatron/core/ssm/gated_delta_net/gdn.py,
// GatedDeltaNet), a linear attention with a recurrent dk×dv state per head.
// Which layers do is --linear-attention-freq's (Megatron's
// get_linear_attention_pattern). The rest of the layer (norms, MLP or MoE,
// residuals) is unchanged.
//
// One gated delta net layer on x (b, t, h), as GatedDeltaNet.forward in
// its deterministic mode (torch-native convolution and delta rule):
//
//	in_proj(x) → q (nk·dk) | k (nk·dk) | v (nv·dv) | z (nv·dv) | b (nv) | a (nv)
//	q|k|v ← silu(causal depthwise conv1d over time, kernel K, no bias)
//	q, k ← l2norm per head (eps 1e-6), repeated to the nv value heads
//	g = −exp(A_log)·softplus(a + dt_bias);  beta = sigmoid(b)
//	o = gated delta rule(q/sqrt(dk), k, v, g, beta)   (tensor.Tape.GatedDeltaRule)
//	out_proj(norm(o) · silu(z))   (norm: the model's normalisation over dv)
//
// The kernels are internal/cpu's (float64-checked); they run on host
// memory (--device cpu and sim), the delta rule in its chunked (WY) form
// over chunks of deltaRuleChunk steps (matrix products; the token-by-token
// recurrence is its reference): O(b·t·nv·dk·dv) time, and the backward
// keeps the state before each chunk (b·nv·dk·dv·t/64 floats) and
// recomputes the chunk. Decoding runs the recurrence (gdn_decode.go).

// GDNConfig is the gated delta net's part of Config; the zero value is a
// model without one.
type GDNConfig struct {
	// Enabled is --experimental-attention-variant gated_delta_net (or gdn,
	// its canonical name).
	Enabled bool
	// LinearAttentionFreq (--linear-attention-freq) marks the layers: an
	// integer N makes layer i (from 0) full attention iff (i+1)%N == 0 and
	// a gated delta net otherwise; a 0/1 list (1 = gated delta net) such as
	// "[1,1,1,0]" gives each layer's.
	LinearAttentionFreq string
	ConvKernel          int // --linear-conv-kernel-dim; 0 means 4
	KeyHeadDim          int // --linear-key-head-dim; 0 means 128
	ValueHeadDim        int // --linear-value-head-dim; 0 means 128
	NumKeyHeads         int // --linear-num-key-heads; 0 means 16
	NumValueHeads       int // --linear-num-value-heads; 0 means 32
}

// deltaRuleChunk is the chunk of the delta rule's chunked form (Megatron's
// chunk_size) and how many steps its backward recomputes from one saved
// state.
const deltaRuleChunk = 64

// validate fills Megatron's defaults and checks c (TransformerConfig's
// checks for the variant).
func (c *GDNConfig) validate(cfg *Config) error {
	if !c.Enabled {
		return nil
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{{"--linear-conv-kernel-dim", &c.ConvKernel, 4}, {"--linear-key-head-dim", &c.KeyHeadDim, 128},
		{"--linear-value-head-dim", &c.ValueHeadDim, 128}, {"--linear-num-key-heads", &c.NumKeyHeads, 16},
		{"--linear-num-value-heads", &c.NumValueHeads, 32}} {
		if *f.v < 0 {
			return fmt.Errorf("gpt: %s=%d: want > 0", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	qk, ok1 := checked.MulInt(c.KeyHeadDim, c.NumKeyHeads)
	v, ok2 := checked.MulInt(c.ValueHeadDim, c.NumValueHeads)
	if !ok1 || !ok2 || qk > math.MaxInt32/4 || v > math.MaxInt32/4 {
		// in_proj's rows, 2·qk + 2·v + 2·nv, are a tensor dimension
		return fmt.Errorf("gpt: --linear-key-head-dim=%d × --linear-num-key-heads=%d or --linear-value-head-dim=%d × --linear-num-value-heads=%d: want each product at most %d",
			c.KeyHeadDim, c.NumKeyHeads, c.ValueHeadDim, c.NumValueHeads, math.MaxInt32/4)
	}
	if c.NumValueHeads%c.NumKeyHeads != 0 {
		return fmt.Errorf("gpt: --linear-num-value-heads=%d must be a multiple of --linear-num-key-heads=%d", c.NumValueHeads, c.NumKeyHeads)
	}
	if strings.TrimSpace(c.LinearAttentionFreq) == "" {
		return fmt.Errorf("gpt: --experimental-attention-variant gated_delta_net needs --linear-attention-freq (the linear/full attention pattern of the layers)")
	}
	if _, err := c.Pattern(cfg.NumLayers); err != nil {
		return err
	}
	if cfg.Activation != SwiGLU {
		// GatedDeltaNet's convolution and output gate use the model's
		// activation_func, silu under --swiglu; the FLA kernels take only silu
		return fmt.Errorf("gpt: --experimental-attention-variant gated_delta_net needs --swiglu (its convolution and output gate use SiLU, the model's activation)")
	}
	return nil
}

// Pattern is each layer's kind for numLayers layers: true for a gated
// delta net, false for full attention (Megatron's
// get_linear_attention_pattern).
func (c *GDNConfig) Pattern(numLayers int) ([]bool, error) {
	s := strings.TrimSpace(c.LinearAttentionFreq)
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 {
			return nil, fmt.Errorf("gpt: --linear-attention-freq=%s: want a positive integer or a list of 0/1 per layer", s)
		}
		p := make([]bool, numLayers)
		for i := range p {
			p[i] = (i+1)%n != 0
		}
		return p, nil
	}
	return parseLayerList("--linear-attention-freq", s, numLayers)
}

// IsGDNLayer reports whether layer i of a validated config is a gated
// delta net.
func (c *Config) IsGDNLayer(i int) bool {
	if !c.GDN.Enabled {
		return false
	}
	p, err := c.GDN.Pattern(c.NumLayers)
	return err == nil && p[i]
}

// NumGDNLayers counts the gated delta net layers of numLayers.
func (c *GDNConfig) NumGDNLayers(numLayers int) int {
	if !c.Enabled {
		return 0
	}
	p, err := c.Pattern(numLayers)
	if err != nil {
		return 0
	}
	n := 0
	for _, on := range p {
		if on {
			n++
		}
	}
	return n
}

// dims are the layer's widths: q (and k) channels, v channels, the
// convolved channels and in_proj's rows.
func (c *GDNConfig) dims() (qk, v, conv, in int) {
	qk, v = c.KeyHeadDim*c.NumKeyHeads, c.ValueHeadDim*c.NumValueHeads
	return qk, v, 2*qk + v, 2*qk + 2*v + 2*c.NumValueHeads
}

// GDNLayer is a gated delta net's parameters, named as Megatron's
// distributed checkpoint stores them under decoder.layers.N.self_attention.:
// in_proj.weight and conv1d.weight are split into their sections
// (GatedDeltaNet.sharded_state_dict's _split_tensor_factory), so each is a
// plain column-parallel slice under tensor parallelism and the layer
// concatenates them back into Megatron's fused weights.
type GDNLayer struct {
	// in_proj.weight.query, .key (nk·dk, h), .value, .z (nv·dv, h), .beta,
	// .alpha (nv, h)
	InQ, InK, InV, InZ, InBeta, InAlpha *tensor.Tensor
	// conv1d.weight.query, .key (nk·dk, K), .value (nv·dv, K): Megatron's
	// (…, 1, K) without the group axis
	ConvQ, ConvK, ConvV  *tensor.Tensor
	DtBias               *tensor.Tensor // dt_bias (nv)
	ALog                 *tensor.Tensor // A_log (nv)
	OutNorm, OutNormBias *tensor.Tensor // out_norm.weight, .bias (dv; the bias for LayerNorm)
	OutProj              *tensor.Tensor // out_proj.weight (h, nv·dv)
}

func (g *GDNLayer) params() []*tensor.Tensor {
	return []*tensor.Tensor{g.InQ, g.InK, g.InV, g.InZ, g.InBeta, g.InAlpha, g.ConvQ, g.ConvK, g.ConvV,
		g.DtBias, g.ALog, g.OutNorm, g.OutNormBias, g.OutProj}
}

// newGDNLayer draws a layer as GatedDeltaNet.reset_parameters and its
// submodules: in_proj normal(0, std), out_proj the output layers' std,
// conv1d PyTorch's Conv1d default uniform(±1/sqrt(K)) (Megatron passes no
// conv_init), dt_bias ones, A_log log(uniform(1, 16)), out_norm as every
// norm.
func newGDNLayer(cfg *Config, prefix string, rng *tensor.RNG, normal func(string, float32, ...int) *tensor.Tensor,
	ones func(string, int) *tensor.Tensor, std, outStd float32) *GDNLayer {
	c := &cfg.GDN
	qk, v, _, _ := c.dims()
	h, nv, k := cfg.HiddenSize, c.NumValueHeads, c.ConvKernel
	p := prefix + "self_attention."
	bound := float32(1 / math.Sqrt(float64(k)))
	conv := func(name string, rows int) *tensor.Tensor {
		w := tensor.Param(name, rows, k)
		rng.Fork(name).Uniform(w.Float32s(), -bound, bound)
		return w
	}
	g := &GDNLayer{
		InQ: normal(p+"in_proj.weight.query", std, qk, h), InK: normal(p+"in_proj.weight.key", std, qk, h),
		InV: normal(p+"in_proj.weight.value", std, v, h), InZ: normal(p+"in_proj.weight.z", std, v, h),
		InBeta: normal(p+"in_proj.weight.beta", std, nv, h), InAlpha: normal(p+"in_proj.weight.alpha", std, nv, h),
		ConvQ: conv(p+"conv1d.weight.query", qk), ConvK: conv(p+"conv1d.weight.key", qk), ConvV: conv(p+"conv1d.weight.value", v),
		DtBias:  tensor.Param(p+"dt_bias", nv),
		ALog:    tensor.Param(p+"A_log", nv),
		OutNorm: ones(p+"out_norm.weight", c.ValueHeadDim),
		OutProj: normal(p+"out_proj.weight", outStd, h, v),
	}
	if cfg.Normalization == LayerNorm {
		g.OutNormBias = tensor.Param(p+"out_norm.bias", c.ValueHeadDim)
	}
	for i := range g.DtBias.Float32s() {
		g.DtBias.Float32s()[i] = 1
	}
	a := g.ALog.Float32s()
	rng.Fork(g.ALog.Name).Uniform(a, 1, 16)
	for i := range a {
		a[i] = float32(math.Log(float64(a[i])))
	}
	return g
}

// gatedDeltaNet is the attention part of a gated delta net layer on the
// normalised x (b, t, h). Its widths come from the weights, so a
// tensor-parallel rank runs its heads (Megatron splits every section of
// in_proj and conv1d, dt_bias and A_log by heads, out_proj by its input).
//
// Decoding (p.gdn set) runs the convolution and the delta rule over each
// sequence's tokens from the state its GDNStates keeps, which they advance:
// the same arithmetic, step for step, as the whole sequence in one call.
func (m *Model) gatedDeltaNet(tp *tensor.Tape, l *GDNLayer, index int, x *tensor.Tensor, p *pass) *tensor.Tensor {
	c := &m.Config.GDN
	sh := m.region()
	dk, dv := c.KeyHeadDim, c.ValueHeadDim
	qk, v, nv := l.InQ.Dim(0), l.InV.Dim(0), l.InBeta.Dim(0) // this rank's
	nk, convC := qk/dk, 2*qk+l.InV.Dim(0)
	in := tp.Concat(0, l.InQ, l.InK, l.InV, l.InZ, l.InBeta, l.InAlpha) // Megatron's fused in_proj
	proj := sh.ColumnLinear(tp, p.lin, x, in, nil)                      // (b, t, 2qk+2v+2nv)
	b, t := proj.Dim(0), proj.Dim(1)
	parts := tp.Split(proj, 2, convC, v, nv, nv)
	var conv, rule []tensor.RecurrentRun
	if p.gdn != nil {
		conv, rule = p.gdnRuns(index)
	}
	convW := tp.Concat(0, l.ConvQ, l.ConvK, l.ConvV)
	var qkv *tensor.Tensor // (b, t, conv)
	if conv != nil {
		qkv = tp.CausalConvSiLURuns(parts[0], convW, conv)
	} else {
		qkv = tp.CausalConvSiLU(parts[0], convW)
	}
	qkvParts := tp.Split(qkv, 2, 2*qk, v)
	qkn := tp.L2Norm(tp.Reshape(tp.Contiguous(qkvParts[0]), b, t, 2*nk, dk), l2NormEps)
	heads := tp.Split(qkn, 2, nk, nk)
	vh := tp.Reshape(tp.Contiguous(qkvParts[1]), b, t, nv, dv)
	g, beta := tp.GDNGates(parts[3], parts[2], l.ALog, l.DtBias)
	var o *tensor.Tensor
	if rule != nil {
		o = tp.GatedDeltaRuleRuns(heads[0], heads[1], vh, g, beta, 1/math.Sqrt(float64(dk)), rule)
	} else {
		o = tp.GatedDeltaRule(heads[0], heads[1], vh, g, beta, 1/math.Sqrt(float64(dk)), deltaRuleChunk)
	}
	z := tp.Reshape(tp.Contiguous(parts[1]), b, t, nv, dv)
	y := tp.Mul(m.norm(tp, o, l.OutNorm, l.OutNormBias), tp.SiLU(z))
	return sh.RowLinear(tp, p.lin, tp.Reshape(y, b, t, v), l.OutProj, nil)
}

// l2NormEps is FLA's l2norm epsilon (Megatron calls it with the default).
const l2NormEps = 1e-6
