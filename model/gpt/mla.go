package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// MLAConfig is multi-latent attention (DeepSeek-V2/V3's MLA) as Megatron's
// MLASelfAttention computes it (--multi-latent-attention). Queries come
// from a low-rank down-projection (QLoraRank; 0 is a plain projection),
// keys and values from a shared latent of KVLoraRank channels plus one
// rotary key of QKPosEmbHeadDim channels shared by every head; each head's
// query and key are [nope; rope] parts, the rotary position embedding
// rotating the rope parts only. Megatron's command line gives the fields
// its defaults (cmd/gotron); the zero value is MLA off.
type MLAConfig struct {
	Enabled bool // --multi-latent-attention
	// QLoraRank (--q-lora-rank) is the query latent's width: the queries
	// are q_up(q_layernorm(q_down(x))), q_layernorm only with
	// --qk-layernorm (Config.QKLayerNorm); 0 (Megatron's None) is one
	// projection linear_q_proj.
	QLoraRank       int
	KVLoraRank      int // --kv-lora-rank
	QKHeadDim       int // --qk-head-dim: the per-head query/key channels without position
	QKPosEmbHeadDim int // --qk-pos-emb-head-dim: the rotary channels of each query and of the shared key
	VHeadDim        int // --v-head-dim
	// Rope (--rope-type) is YaRN (the zero value, MLA's default) or plain
	// rotary embeddings.
	Rope RopeType
	// ScalingFactor (--rotary-scaling-factor), Mscale (--mscale) and
	// MscaleAllDim (--mscale-all-dim) are YaRN's; OriginalMaxPositions,
	// BetaFast and BetaSlow are MLATransformerConfig's
	// original_max_position_embeddings, beta_fast and beta_slow, which
	// Megatron's command line leaves at 4096, 32 and 1 (DefaultMLA).
	ScalingFactor, Mscale, MscaleAllDim float64
	OriginalMaxPositions                int
	BetaFast, BetaSlow                  float64
}

// DefaultMLA is MLA with the values Megatron's command line gives when
// only --multi-latent-attention is set (arguments.py's _add_mla_args and
// MLATransformerConfig's defaults for the fields without a flag).
func DefaultMLA() MLAConfig {
	return MLAConfig{Enabled: true, KVLoraRank: 32, QKHeadDim: 128, QKPosEmbHeadDim: 64, VHeadDim: 128,
		ScalingFactor: 1, Mscale: 1, MscaleAllDim: 0, OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1}
}

// QHeadDim is the width of each query and key head: [nope; rope].
func (c *MLAConfig) QHeadDim() int { return c.QKHeadDim + c.QKPosEmbHeadDim }

// SoftmaxScale is Megatron's MLA softmax scale, mscale²/sqrt(q head dim)
// with mscale = _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim).
// Megatron computes it from those fields whatever the rope type.
func (c *MLAConfig) SoftmaxScale() float32 {
	m := tensor.YarnMscale(c.ScalingFactor, c.MscaleAllDim)
	return float32(m * m / math.Sqrt(float64(c.QHeadDim())))
}

func (c *MLAConfig) validate(cfg *Config) error {
	if !c.Enabled {
		if *c != (MLAConfig{}) {
			return fmt.Errorf("gpt: MLA settings %+v without --multi-latent-attention", *c)
		}
		return nil
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.QLoraRank < 0:
		return fmt.Errorf("gpt: --q-lora-rank=%d: want > 0 (or unset for a plain query projection)", c.QLoraRank)
	case c.KVLoraRank <= 0:
		return fmt.Errorf("gpt: --kv-lora-rank=%d: want > 0", c.KVLoraRank)
	case c.QKHeadDim <= 0:
		return fmt.Errorf("gpt: --qk-head-dim=%d: want > 0", c.QKHeadDim)
	case c.QKPosEmbHeadDim <= 0 || c.QKPosEmbHeadDim%2 != 0:
		return fmt.Errorf("gpt: --qk-pos-emb-head-dim=%d: want an even number > 0 (the rotary channels come in pairs)", c.QKPosEmbHeadDim)
	case c.VHeadDim <= 0:
		return fmt.Errorf("gpt: --v-head-dim=%d: want > 0", c.VHeadDim)
	case !c.Rope.valid():
		return fmt.Errorf("gpt: --rope-type=%v: want rope or yarn", c.Rope)
	case !(c.ScalingFactor > 0) || !finite(c.ScalingFactor):
		return fmt.Errorf("gpt: --rotary-scaling-factor=%g: want a finite value > 0", c.ScalingFactor)
	case !finite(c.Mscale) || !finite(c.MscaleAllDim):
		return fmt.Errorf("gpt: --mscale=%g --mscale-all-dim=%g: want finite values", c.Mscale, c.MscaleAllDim)
	case !(tensor.YarnMscale(c.ScalingFactor, c.MscaleAllDim) > 0):
		return fmt.Errorf("gpt: --mscale-all-dim=%g with --rotary-scaling-factor=%g gives a softmax mscale %g: want > 0", c.MscaleAllDim, c.ScalingFactor, tensor.YarnMscale(c.ScalingFactor, c.MscaleAllDim))
	case c.OriginalMaxPositions <= 0:
		return fmt.Errorf("gpt: MLA original_max_position_embeddings=%d: want > 0", c.OriginalMaxPositions)
	case !(c.BetaFast > 0) || !(c.BetaSlow > 0) || !finite(c.BetaFast) || !finite(c.BetaSlow):
		return fmt.Errorf("gpt: MLA beta_fast=%g beta_slow=%g: want finite values > 0", c.BetaFast, c.BetaSlow)
	// what Megatron refuses or gotron's MLA does not build
	case cfg.NumQueryGroups != cfg.NumAttentionHeads:
		return fmt.Errorf("gpt: --group-query-attention (--num-query-groups=%d) with --multi-latent-attention: Megatron makes them mutually exclusive", cfg.NumQueryGroups)
	case cfg.RotaryInterleaved:
		return fmt.Errorf("gpt: --rotary-interleaved with --multi-latent-attention: Megatron refuses it (MLA de-interleaves its rotary channels itself)")
	case cfg.RotaryPercent != 1:
		return fmt.Errorf("gpt: --rotary-percent=%g with --multi-latent-attention is not built (MLA rotates all --qk-pos-emb-head-dim channels)", cfg.RotaryPercent)
	case cfg.AttentionOutputGate:
		return fmt.Errorf("gpt: --attention-output-gate with --multi-latent-attention: Megatron does not support it (\"Output gate is not supported for MLA yet\")")
	case cfg.GDN.Enabled:
		return fmt.Errorf("gpt: --experimental-attention-variant with --multi-latent-attention is not built (gated delta net layers with MLA layers)")
	case cfg.AddQKVBias:
		return fmt.Errorf("gpt: --add-qkv-bias with --multi-latent-attention: MLA's projections have no bias")
	}
	return nil
}

// mlaRoPE is MLA's rotary embedding of the rope channels: Megatron's
// YarnRotaryEmbedding (or RotaryEmbedding for --rope-type rope) over
// QKPosEmbHeadDim channels, applied with mla_rotary_interleaved. That
// de-interleaves each head's rope channels ([evens; odds]) and rotates
// halves; the same permutation of every query and key leaves their
// products unchanged, so the Interleaved style on the channels in place
// computes the same attention (internal/cpu's TestYarnMatchesMegatron
// checks the rotation against Megatron's).
func (c *Config) mlaRoPE() (*tensor.RoPE, error) {
	mla := &c.MLA
	rc := tensor.RoPEConfig{Dim: mla.QKPosEmbHeadDim, Base: c.RotaryBase, MaxPositions: c.MaxPositionEmbeddings, Style: tensor.Interleaved}
	if mla.Rope == Yarn {
		rc.Yarn = &tensor.YarnScaling{Factor: mla.ScalingFactor, OriginalMaxPositions: mla.OriginalMaxPositions,
			BetaFast: mla.BetaFast, BetaSlow: mla.BetaSlow, Mscale: mla.Mscale, MscaleAllDim: mla.MscaleAllDim}
	}
	return tensor.NewRoPE(rc)
}

// newMLA fills l's MLA projections and norms with Megatron's initialisation
// (every projection init_method, the norms one). The latents' norms
// (q_layernorm, kv_layernorm) exist only with --qk-layernorm: Megatron's
// layer specs make them IdentityOp (and the up-projections plain linears)
// without it.
func newMLA(c *Config, l *Layer, p string, normal func(string, float32, ...int) *tensor.Tensor, ones func(string, int) *tensor.Tensor,
	bias func(string, int, bool) *tensor.Tensor) {
	mla, h, a, std := &c.MLA, c.HiddenSize, c.NumAttentionHeads, c.InitMethodStd
	ln := c.Normalization == LayerNorm
	if mla.QLoraRank == 0 {
		l.QProj = normal(p+"self_attention.linear_q_proj.weight", std, a*mla.QHeadDim(), h)
	} else {
		l.QDown = normal(p+"self_attention.linear_q_down_proj.weight", std, mla.QLoraRank, h)
		l.QUp = normal(p+"self_attention.linear_q_up_proj.weight", std, a*mla.QHeadDim(), mla.QLoraRank)
		if c.QKLayerNorm {
			l.QNorm = ones(p+"self_attention.q_layernorm.weight", mla.QLoraRank)
			l.QNormBias = bias(p+"self_attention.q_layernorm.bias", mla.QLoraRank, ln)
		}
	}
	l.KVDown = normal(p+"self_attention.linear_kv_down_proj.weight", std, mla.KVLoraRank+mla.QKPosEmbHeadDim, h)
	l.KVUp = normal(p+"self_attention.linear_kv_up_proj.weight", std, a*(mla.QKHeadDim+mla.VHeadDim), mla.KVLoraRank)
	if c.QKLayerNorm {
		l.KVNorm = ones(p+"self_attention.kv_layernorm.weight", mla.KVLoraRank)
		l.KVNormBias = bias(p+"self_attention.kv_layernorm.bias", mla.KVLoraRank, ln)
	}
}

// mlaNorm is q_layernorm or kv_layernorm on a latent: the model's norm
// with --qk-layernorm, the identity (Megatron's IdentityOp) without.
func (m *Model) mlaNorm(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	if w == nil {
		return x
	}
	return m.norm(tp, x, w, b)
}

// mlaAttention is MLASelfAttention's forward (get_query_key_value_tensors,
// core attention, linear_proj). The down-projections and the latents'
// norms are replicated on every tensor-parallel rank (Megatron's
// "duplicated" TELinear) and run on the layer's input as it is, sequence
// shards with SP; the up-projections are column-parallel (this rank's
// heads) and the output projection row-parallel. The shared rotary key
// enters the tensor-parallel region as a column-parallel input does:
// all-gathered from sequence shards with SP; without SP its gradient is
// all-reduced over the ranks' heads (Megatron's code leaves that partial).
func (m *Model) mlaAttention(tp *tensor.Tape, l *Layer, index int, x *tensor.Tensor, p *pass) *tensor.Tensor {
	c := &m.Config
	mla := &c.MLA
	sh := m.region()
	qd, pe, nope, vd := mla.QHeadDim(), mla.QKPosEmbHeadDim, mla.QKHeadDim, mla.VHeadDim

	var q *tensor.Tensor
	qc := x // the query latent (DSA's indexer reads it)
	if l.QProj != nil {
		q = sh.ColumnLinear(tp, p.lin, x, l.QProj, nil)
	} else {
		qc = p.lin.Linear(tp, x, l.QDown, nil) // (b, t[/TP], q_lora_rank)
		qc = m.mlaNorm(tp, qc, l.QNorm, l.QNormBias)
		q = sh.ColumnLinear(tp, p.lin, qc, l.QUp, nil)
	}
	kvc := p.lin.Linear(tp, x, l.KVDown, nil) // (b, t[/TP], kv_lora_rank + pe)
	parts := tp.Split(kvc, 2, mla.KVLoraRank, pe)
	latent := m.mlaNorm(tp, parts[0], l.KVNorm, l.KVNormBias)
	if p.mlaLatents { // decoding with the latents cached (mla_latent.go)
		return m.mlaLatentAttention(tp, l, index, q, latent, parts[1], p)
	}
	kv := sh.ColumnLinear(tp, p.lin, latent, l.KVUp, nil) // (b, t, n·(nope+v)), this rank's heads
	kpe := sh.EnterRegion(tp, parts[1])                   // (b, t, pe)

	b, t := q.Dim(0), q.Dim(1)
	n := q.Dim(2) / qd // heads held here
	q = tp.Reshape(q, b, t, n, qd)
	qs := tp.Split(q, 3, nope, pe)
	qpe := tp.RoPE(qs[1], m.rope, p.positions)
	q = tp.Concat(3, qs[0], qpe)

	kvs := tp.Split(tp.Reshape(kv, b, t, n, nope+vd), 3, nope, vd)
	kpe = tp.RoPE(tp.Reshape(kpe, b, t, 1, pe), m.rope, p.positions)
	shared := make([]*tensor.Tensor, n) // the rotary key, one copy per head
	for i := range shared {
		shared[i] = kpe
	}
	k := tp.Concat(3, kvs[0], tp.Concat(2, shared...))
	v := kvs[1]
	if l.DSA != nil { // DeepSeek sparse attention's core in place of the fused one (dsa.go)
		o := m.dsaAttention(tp, l, index, x, qc, q, k, v, p)
		return sh.RowLinear(tp, p.lin, tp.Reshape(o, b, t, n*vd), l.Proj, l.ProjBias)
	}

	// The fused attention takes one head width: pad the narrower of
	// (q, k) and v with zero channels (as Megatron's THD path pads v);
	// zeros add nothing to the scores or the outputs, and the scale is
	// explicit.
	w := max(qd, vd)
	if vd < w {
		v = tp.Concat(3, v, tensor.ZerosOn(v.Device(), b, t, n, w-vd))
	} else if qd < w {
		z := tensor.ZerosOn(q.Device(), b, t, n, w-qd)
		q, k = tp.Concat(3, q, z), tp.Concat(3, k, z)
	}
	o := p.core.Attend(tp, index, q, k, v) // (b, t, n, w)
	if vd < w {
		o = tp.Narrow(o, 3, 0, vd)
	}
	return sh.RowLinear(tp, p.lin, tp.Reshape(tp.Contiguous(o), b, t, n*vd), l.Proj, l.ProjBias)
}

// mlaParamCount is the parameters of one layer's MLA attention without the
// output projection; norm is a norm's parameters per hidden channel, and
// the latents have norms only with --qk-layernorm.
func (c *Config) mlaParamCount(norm float64) float64 {
	mla := &c.MLA
	if !c.QKLayerNorm {
		norm = 0
	}
	h, a := float64(c.HiddenSize), float64(c.NumAttentionHeads)
	qd, q, kv := float64(mla.QHeadDim()), float64(mla.QLoraRank), float64(mla.KVLoraRank)
	n := kv*h + float64(mla.QKPosEmbHeadDim)*h + a*float64(mla.QKHeadDim+mla.VHeadDim)*kv + norm/h*kv
	if mla.QLoraRank == 0 {
		return n + a*qd*h
	}
	return n + q*h + a*qd*q + norm/h*q
}
