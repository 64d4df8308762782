package gpt

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/gotron/gotron/tensor"
)

// DeepSeek sparse attention (DeepSeek-V3.2's DSA), Megatron's
// --experimental-attention-variant dsa (megatron/core/transformer/
// experimental_attention_variant/dsa.py: DSAIndexer, DSAttention): every
// MLA layer's core attention attends, for each query, only to the
// --dsa-indexer-topk causal keys a small "lightning indexer" scores
// highest. One layer on its input x (after input_layernorm) and the query
// latent qr (q_layernorm's output, the down-projection's without
// --qk-layernorm; x without --q-lora-rank), both detached
// (the indexer trains on its own loss only):
//
//	q_I = rope(linear_wq_b(qr))  (b, t, H, D), the first rope channels rotated
//	k_I = rope(k_norm(linear_wk(x)))  (b, t, D), k_norm a LayerNorm
//	q_I, k_I ← Hadamard rotation (rotate_activation, unless --no-dsa-indexer-rotate-activation)
//	w = linear_weights_proj(x) · H^-½ · D^-½  (b, t, H)
//	score(i, j) = Σ_h w[i][h]·relu(q_I[i][h]·k_I[j])  for j ≤ i
//	o = MLA's attention of each query over its top-k keys by score
//
// In training (with --dsa-indexer-loss-coeff > 0) the indexer's loss is the
// KL divergence of softmax(score) from the main attention's probabilities
// (query and key detached) summed over the heads and normalised, times the
// coefficient, over the b·t rows; it is attached to o as Megatron's
// DSAIndexerLossAutoScaler attaches it (its gradient the main loss's
// backward scale) and logged as "indexer loss".

// DSAConfig is DSA's part of Config; the zero value is off. The zero values
// of the switches are Megatron's defaults.
type DSAConfig struct {
	Enabled        bool // --experimental-attention-variant dsa (needs --multi-latent-attention)
	IndexerHeads   int  // --dsa-indexer-n-heads
	IndexerHeadDim int  // --dsa-indexer-head-dim
	TopK           int  // --dsa-indexer-topk
	// LossCoeff (--dsa-indexer-loss-coeff) weighs the indexer's KL loss;
	// 0 (Megatron's None) trains no indexer loss.
	LossCoeff float64
	// SparseLoss (--dsa-indexer-use-sparse-loss) computes the loss over
	// each query's selected keys only.
	SparseLoss bool
	// RopeInterleaved (--dsa-indexer-rope-interleaved) applies the
	// indexer's rotary embedding MLA's way (de-interleaved) instead of
	// rotating halves.
	RopeInterleaved bool
	// NoRotateActivation (--no-dsa-indexer-rotate-activation) skips the
	// Hadamard rotation of the indexer's queries and keys.
	NoRotateActivation bool
	// NoScoringReLU (--no-dsa-indexer-scoring-relu) scores without the ReLU
	// of each head's product (GLM-5's indexer).
	NoScoringReLU bool
	// KNormEpsilon (--dsa-indexer-k-norm-epsilon) is k_norm's epsilon; 0
	// (Megatron's None) takes --norm-epsilon.
	KNormEpsilon float64
}

func (c *DSAConfig) validate(cfg *Config) error {
	if !c.Enabled {
		if *c != (DSAConfig{}) {
			return fmt.Errorf("gpt: DSA settings %+v without --experimental-attention-variant dsa", *c)
		}
		return nil
	}
	mla := &cfg.MLA
	switch {
	case !mla.Enabled:
		return fmt.Errorf("gpt: --experimental-attention-variant dsa needs --multi-latent-attention (Megatron: \"Currently only MLA supports sparse attention\")")
	case c.IndexerHeads <= 0:
		return fmt.Errorf("gpt: --dsa-indexer-n-heads=%d: want > 0 (DSA needs it)", c.IndexerHeads)
	case c.IndexerHeadDim <= 0 || c.IndexerHeadDim > 1<<16:
		return fmt.Errorf("gpt: --dsa-indexer-head-dim=%d: want 1..65536 (DSA needs it)", c.IndexerHeadDim)
	case c.IndexerHeads > 1<<16:
		return fmt.Errorf("gpt: --dsa-indexer-n-heads=%d: want at most 65536", c.IndexerHeads)
	case c.TopK <= 0:
		return fmt.Errorf("gpt: --dsa-indexer-topk=%d: want > 0 (DSA needs it)", c.TopK)
	case c.IndexerHeadDim < mla.QKPosEmbHeadDim:
		return fmt.Errorf("gpt: --dsa-indexer-head-dim=%d: want at least --qk-pos-emb-head-dim=%d (the indexer rotates its first rope channels)", c.IndexerHeadDim, mla.QKPosEmbHeadDim)
	case !c.NoRotateActivation && c.IndexerHeadDim&(c.IndexerHeadDim-1) != 0:
		return fmt.Errorf("gpt: --dsa-indexer-head-dim=%d: the Hadamard rotation (rotate_activation) needs a power of two (or --no-dsa-indexer-rotate-activation)", c.IndexerHeadDim)
	case !(c.LossCoeff >= 0) || math.IsInf(c.LossCoeff, 0):
		return fmt.Errorf("gpt: --dsa-indexer-loss-coeff=%g: want a finite value >= 0", c.LossCoeff)
	case !(c.KNormEpsilon >= 0) || math.IsInf(c.KNormEpsilon, 0):
		return fmt.Errorf("gpt: --dsa-indexer-k-norm-epsilon=%g: want a finite value > 0 (or unset for --norm-epsilon)", c.KNormEpsilon)
	case !cfg.DisableBiasLinear:
		// TransformerConfig's check
		return fmt.Errorf("gpt: --experimental-attention-variant dsa needs --disable-bias-linear (Megatron: \"DSA uses AbsorbedMLASelfAttention, which requires add_bias_linear=False\")")
	}
	return nil
}

// DSAIndexer is one layer's lightning indexer, Megatron's
// self_attention.core_attention.indexer: linear_wq_b (H·D, q_lora_rank, or
// hidden without --q-lora-rank), linear_wk (D, h), k_norm (a LayerNorm of
// D, with bias) and linear_weights_proj (H, h). Every tensor-parallel
// rank holds it whole.
type DSAIndexer struct {
	WqB, Wk, KNorm, KNormBias, WeightsProj *tensor.Tensor
}

func (d *DSAIndexer) params() []*tensor.Tensor {
	if d == nil {
		return nil
	}
	return []*tensor.Tensor{d.WqB, d.Wk, d.KNorm, d.KNormBias, d.WeightsProj}
}

// dsaIndexerPrefix is the indexer's parameter names' part after the layer's.
const dsaIndexerPrefix = "self_attention.core_attention.indexer."

// IsDSAIndexer reports whether parameter name is a DSA indexer's.
func IsDSAIndexer(name string) bool { return strings.Contains(name, dsaIndexerPrefix) }

// newDSAIndexer is Megatron's initialisation: the projections init_method,
// k_norm one and zero (zero with --apply-layernorm-1p: 1 + γ).
func newDSAIndexer(c *Config, p string, normal func(string, float32, ...int) *tensor.Tensor, ones func(string, int) *tensor.Tensor) *DSAIndexer {
	d, h, std := &c.DSA, c.HiddenSize, c.InitMethodStd
	qIn := c.MLA.QLoraRank
	if qIn == 0 {
		qIn = h
	}
	p += dsaIndexerPrefix
	return &DSAIndexer{
		WqB:         normal(p+"linear_wq_b.weight", std, d.IndexerHeads*d.IndexerHeadDim, qIn),
		Wk:          normal(p+"linear_wk.weight", std, d.IndexerHeadDim, h),
		KNorm:       ones(p+"k_norm.weight", d.IndexerHeadDim),
		KNormBias:   tensor.Param(p+"k_norm.bias", d.IndexerHeadDim),
		WeightsProj: normal(p+"linear_weights_proj.weight", std, d.IndexerHeads, h),
	}
}

// dsaRoPE is the indexer's rotary embedding: MLA's (YaRN or plain, over
// --qk-pos-emb-head-dim channels) rotating halves as Megatron's
// apply_rotary_pos_emb without interleaving; with
// --dsa-indexer-rope-interleaved MLA's de-interleaved rotation, which is
// the Interleaved style up to one permutation of the channels shared by
// the indexer's queries and keys (their products, and so the scores, are
// the same: see mlaRoPE).
func (c *Config) dsaRoPE() (*tensor.RoPE, error) {
	mla := &c.MLA
	style := tensor.RotateHalf
	if c.DSA.RopeInterleaved {
		style = tensor.Interleaved
	}
	rc := tensor.RoPEConfig{Dim: mla.QKPosEmbHeadDim, Base: c.RotaryBase, MaxPositions: c.MaxPositionEmbeddings, Style: style}
	if mla.Rope == Yarn {
		rc.Yarn = &tensor.YarnScaling{Factor: mla.ScalingFactor, OriginalMaxPositions: mla.OriginalMaxPositions,
			BetaFast: mla.BetaFast, BetaSlow: mla.BetaSlow, Mscale: mla.Mscale, MscaleAllDim: mla.MscaleAllDim}
	}
	return tensor.NewRoPE(rc)
}

// dsaParamCount is one layer's indexer parameters.
func (c *Config) dsaParamCount() float64 {
	if !c.DSA.Enabled {
		return 0
	}
	d := &c.DSA
	h, H, D := float64(c.HiddenSize), float64(d.IndexerHeads), float64(d.IndexerHeadDim)
	qIn := float64(c.MLA.QLoraRank)
	if qIn == 0 {
		qIn = h
	}
	return H*D*qIn + D*h + 2*D + H*h
}

// ErrDSAContextParallel refuses DSA under context parallelism: Megatron's
// all-gather CP layout for the indexer is not built here.
var ErrDSAContextParallel = errors.New("gpt: --experimental-attention-variant dsa with --context-parallel-size > 1 is not built (Megatron gathers the keys over the context-parallel ranks for the indexer)")

// IndexerLossName is the indexer loss's name in the log and TensorBoard
// (Megatron's total_loss_dict and add_scalar name).
const IndexerLossName = "indexer loss"

// DSAState is what DSA layers keep between micro-batches: the backward
// scale of their indexer losses and the losses to log.
type DSAState struct {
	// LossScale is the gradient each indexer loss receives (Megatron's
	// DSAIndexerLossAutoScaler.main_loss_backward_scale, loss_scale/M).
	LossScale float64
	// PerTokenLoss is --calculate-per-token-loss: each indexer loss is its
	// rows' sum, not their mean (Megatron's calculate_per_token_loss), and
	// LossScale the loss scale alone.
	PerTokenLoss bool
	losses       []float64 // per layer, summed over micro-batches
}

// IndexerLoss returns the iteration's logged indexer loss as Megatron's
// DSAIndexerLossLoggingHelper.track_indexer_metrics computes it before its
// reductions over ranks: the layers' losses summed over micro-batches over
// microBatches, summed over layers over the number of layers. It resets
// the losses. ok is false when the model trains no indexer loss.
func (m *Model) IndexerLoss(microBatches int) (loss float64, ok bool) {
	s := m.dsa
	if s == nil || m.Config.DSA.LossCoeff <= 0 {
		return 0, false
	}
	for i, v := range s.losses {
		loss += v / float64(microBatches)
		s.losses[i] = 0
	}
	return loss / float64(m.Config.NumLayers), true
}

// dsaAttention is DSAttention's forward in place of MLA's core attention:
// x (b, t[/TP], h) is the attention's input, qr the query latent (x
// without --q-lora-rank), q and k (b, t, n, nope+rope) MLA's queries and
// keys, v (b, t, n, v) its values, for this rank's n heads; it returns the
// attention output (b, t, n, v). DSAttention has no attention dropout and
// takes no attention mask (its mask type is causal), as Megatron's.
func (m *Model) dsaAttention(tp *tensor.Tape, l *Layer, index int, x, qr, q, k, v *tensor.Tensor, p *pass) *tensor.Tensor {
	c := &m.Config
	d := &c.DSA
	if m.ContextParallel != nil {
		tp.Fail(ErrDSAContextParallel)
		return tensor.ZerosOn(v.Device(), v.Shape()...)
	}
	if core, ok := p.core.(*causalAttention); ok && core.docIDs != nil {
		tp.Fail(fmt.Errorf("gpt: --experimental-attention-variant dsa with --reset-attention-mask is not built (Megatron's DSAttention attends causally over the whole sequence)"))
		return tensor.ZerosOn(v.Device(), v.Shape()...)
	}
	ix := l.DSA
	sh := m.region()
	// Megatron detaches x and qr: no gradient of the indexer reaches the
	// model; with sequence parallelism each rank gathers the whole
	// sequence (gather_from_sequence_parallel_region), which a detached
	// input's entering records nothing for.
	xs := sh.EnterRegion(tp, tp.Detach(x))
	qs := sh.EnterRegion(tp, tp.Detach(qr))
	b, t := xs.Dim(0), xs.Dim(1)
	H, D, pe := d.IndexerHeads, d.IndexerHeadDim, c.MLA.QKPosEmbHeadDim

	// x_pe first, x_nope after (DSAIndexer._apply_rope)
	rope := func(y *tensor.Tensor) *tensor.Tensor {
		if pe == D {
			return tp.RoPE(y, m.dsaRope, p.positions)
		}
		parts := tp.Split(y, 3, pe, D-pe)
		return tp.Concat(3, tp.RoPE(parts[0], m.dsaRope, p.positions), parts[1])
	}
	qi := rope(tp.Reshape(p.lin.Linear(tp, qs, ix.WqB, nil), b, t, H, D))
	eps := float32(d.KNormEpsilon)
	if eps == 0 {
		eps = c.NormEpsilon
	}
	kw := ix.KNorm
	if c.LayerNorm1P {
		kw = tp.Add(kw, onesLike(kw))
	}
	ki := tp.LayerNorm(p.lin.Linear(tp, xs, ix.Wk, nil), kw, ix.KNormBias, eps)
	ki = rope(tp.Reshape(ki, b, t, 1, D))
	if !d.NoRotateActivation {
		qi, ki = tp.Hadamard(qi), tp.Hadamard(ki)
	}
	ki = tp.Reshape(ki, b, t, D)
	w := tp.Scale(p.lin.Linear(tp, xs, ix.WeightsProj, nil), float32(1/math.Sqrt(float64(H))/math.Sqrt(float64(D))))

	sel, err := tensor.DSAIndexerTopK(qi, ki, w, d.TopK, !d.NoScoringReLU)
	if err != nil {
		tp.Fail(err)
		return tensor.ZerosOn(v.Device(), v.Shape()...)
	}
	scale := c.MLA.SoftmaxScale()
	o := tp.SparseAttention(q, k, v, sel, scale)

	// the loss where Megatron computes it: training with gradients (a
	// checkpointed block's recomputation, not its first pass)
	if d.LossCoeff <= 0 || !tp.Recording() || p.rng == nil {
		return o
	}
	target, err := tensor.DSAIndexerTarget(tp.Detach(q), tp.Detach(k), sel, scale, d.SparseLoss)
	if err != nil {
		tp.Fail(err)
		return o
	}
	// attention_scores are scattered to TP ranks in head dimension
	target = sh.SumOverRanks(tp, target)
	o, loss := tp.AttachIndexerLoss(o, qi, ki, w, target, sel, tensor.DSAIndexerLoss{
		Coeff: d.LossCoeff, GradScale: m.dsa.LossScale, ReLU: !d.NoScoringReLU, Sparse: d.SparseLoss, PerToken: m.dsa.PerTokenLoss})
	if m.dsa.losses == nil {
		m.dsa.losses = make([]float64, c.NumLayers)
	}
	m.dsa.losses[index] += loss
	return o
}
