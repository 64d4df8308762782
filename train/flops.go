package train

import "github.com/gotron/gotron/model/gpt"

// FLOPsPerIteration is Megatron's num_floating_point_operations
// (megatron/training/training.py) for a GPT, dense or MoE: model FLOPs of
// one iteration over globalBatch samples of seqLen tokens, counting
// forward, dgrad and wgrad GEMMs and the causal half of attention scores.
// An MoE layer counts its top-k routed experts and its shared expert (not
// the router, as Megatron). Multi-latent attention counts its
// projections (norms as one FLOP per latent channel) and cores as
// Megatron's MLA branch. The attention output gate counts its projection
// (--attention-output-gate), and a gated delta net layer counts its
// projections, convolution and delta rule as Megatron's
// linear-attention branch, with no core (seqLen²) term.
func FLOPsPerIteration(c gpt.Config, globalBatch, seqLen int) float64 {
	h, f, L := float64(c.HiddenSize), float64(c.FFNHiddenSize), float64(c.NumLayers)
	d := float64(c.KVChannels)
	q, k := d*float64(c.NumAttentionHeads), d*float64(c.NumQueryGroups)
	V := float64(c.VocabSize)
	e := 2.0
	if c.Activation == gpt.SwiGLU {
		e = 3
	}
	T := float64(globalBatch) * float64(seqLen)
	S2 := float64(globalBatch) * float64(seqLen) * float64(seqLen)
	mlp := f * e * L
	if moe := c.MoE; moe.Enabled() {
		nMoE := float64(moe.NumMoELayers(c.NumLayers))
		mlp = f*e*(L-nMoE) + float64(moe.FFNHiddenSize)*float64(moe.TopK)*e*nMoE + float64(moe.SharedExpertFFN)*e*nMoE
	}
	// self-attention: its token-linear GEMMs and its core (the causal half
	// of QKᵀ and of softmax·V, each over seqLen² per sample)
	attnLinear, attnCore := h*(q+2*k)+q*h, q
	if mla := c.MLA; mla.Enabled {
		n := float64(c.NumAttentionHeads)
		qk, pe, v := float64(mla.QKHeadDim), float64(mla.QKPosEmbHeadDim), float64(mla.VHeadDim)
		qTerm := h * n * (qk + pe)
		if mla.QLoraRank > 0 {
			qTerm = float64(mla.QLoraRank) * (h + n*(qk+pe) + 1)
		}
		attnLinear = qTerm + float64(mla.KVLoraRank)*(h+n*(qk+v)+1) + h*pe + n*v*h
		attnCore = n*(qk+pe)/2 + n*v/2
	}
	if c.AttentionOutputGate {
		attnLinear += h * q // the gate's rows of linear_qkv
	}
	std, linear := L, 0.0 // standard attention layers; gated delta nets' token-linear FLOPs
	if g := c.GDN; g.Enabled {
		n := float64(g.NumGDNLayers(c.NumLayers))
		qk, v := float64(g.KeyHeadDim*g.NumKeyHeads), float64(g.ValueHeadDim*g.NumValueHeads)
		nv, dv := float64(g.NumValueHeads), float64(g.ValueHeadDim)
		in := 2*qk + 2*v + 2*nv
		// in_proj, conv1d, the delta rule (Megatron's 4·nv·dv²: KKᵀ, VKᵀ,
		// S(a(I−bKKᵀ)) and SQ) and out_proj
		linear = n * (h*in + float64(g.ConvKernel)*(2*qk+v) + nv*dv*dv*4 + h*v)
		std = L - n
	}
	return T*(6*h*mlp+6*(attnLinear*std+linear)+6*h*V) + S2*6*attnCore*std
}
