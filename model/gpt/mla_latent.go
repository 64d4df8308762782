package gpt

import "github.com/gotron/gotron/tensor"

// mlaLatentAttention is MLA's attention for decoding with the latents
// cached (Model.CacheMLALatents, Megatron's --cache-mla-latents): the
// cache keeps each position's normalised key-value latent c (kv_lora_rank)
// and rotated rotary key r (qk_pos_emb_head_dim), one "head" shared by
// every query head, instead of every head's key and value. With
// linear_kv_up_proj's rows of head j split into W_UK,j (nope, kv_lora) and
// W_UV,j (v, kv_lora), head j's score of a position is
//
//	q_nope,j·(W_UK,j c) + q_rope,j·r = (W_UK,jᵀ q_nope,j)·c + q_rope,j·r
//
// so the query [W_UK,jᵀ q_nope,j; q_rope,j] attends over the keys [c; r]
// (multi-query attention, width kv_lora + rope); the values are the same
// [c; r], of which the output keeps c's channels, and head j's output is
// W_UV,j times that weighted latent. The same attention as mlaAttention's,
// summed in another order. q is this rank's heads' queries (b, t, n·(nope
// + rope)) before the rotation, latent (b, t, kv_lora) and kpe (b, t, rope)
// are replicated on every tensor-parallel rank.
func (m *Model) mlaLatentAttention(tp *tensor.Tape, l *Layer, index int, q, latent, kpe *tensor.Tensor, p *pass) *tensor.Tensor {
	mla := &m.Config.MLA
	sh := m.region()
	qd, pe, nope, vd, kvr := mla.QHeadDim(), mla.QKPosEmbHeadDim, mla.QKHeadDim, mla.VHeadDim, mla.KVLoraRank
	b, t := q.Dim(0), q.Dim(1)
	n := q.Dim(2) / qd // heads held here
	qs := tp.Split(tp.Reshape(q, b, t, n, qd), 3, nope, pe)
	qpe := tp.RoPE(qs[1], m.rope, p.positions)                      // (b, t, n, pe)
	w := tp.Split(tp.Reshape(l.KVUp, n, nope+vd, kvr), 1, nope, vd) // W_UK (n, nope, kvr), W_UV (n, v, kvr)
	qn := tp.Transpose(tp.Reshape(tp.Contiguous(qs[0]), b*t, n, nope), 0, 1)
	qa := tp.MatMul(qn, w[0], tensor.NoTrans, tensor.NoTrans) // (n, b·t, kvr): W_UKᵀ q_nope
	qa = tp.Reshape(tp.Contiguous(tp.Transpose(qa, 0, 1)), b, t, n, kvr)
	qAbs := tp.Concat(3, qa, qpe) // (b, t, n, kvr + pe)

	kpe = tp.RoPE(tp.Reshape(sh.EnterRegion(tp, kpe), b, t, 1, pe), m.rope, p.positions)
	k := tp.Concat(3, tp.Reshape(sh.EnterRegion(tp, latent), b, t, 1, kvr), kpe) // (b, t, 1, kvr + pe)
	o := p.core.Attend(tp, index, qAbs, k, k)                                    // (b, t, n, kvr + pe)
	ol := tp.Transpose(tp.Reshape(tp.Contiguous(tp.Narrow(o, 3, 0, kvr)), b*t, n, kvr), 0, 1)
	ov := tp.MatMul(ol, w[1], tensor.NoTrans, tensor.Trans) // (n, b·t, v): W_UV times the weighted latent
	ov = tp.Reshape(tp.Contiguous(tp.Transpose(ov, 0, 1)), b, t, n*vd)
	return sh.RowLinear(tp, p.lin, ov, l.Proj, l.ProjBias)
}
