package train

import "github.com/gotron/gotron/model/gpt"

// FLOPsPerIteration is Megatron's num_floating_point_operations
// (megatron/training/training.py) for a GPT, dense or MoE: model FLOPs of
// one iteration over globalBatch samples of seqLen tokens, counting
// forward, dgrad and wgrad GEMMs and the causal half of attention scores.
// An MoE layer counts its top-k routed experts and its shared expert (not
// the router, as Megatron).
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
	return T*(6*h*mlp+6*(h*(q+2*k)+q*h)*L+6*h*V) + S2*6*q*L
}
