package cpu

import (
	"math"
	"sort"
)

// The kernels of DeepSeek sparse attention (DSA, Megatron's
// --experimental-attention-variant dsa: megatron/core/transformer/
// experimental_attention_variant/dsa.py), written once for float32 (the
// model) and float64 (the finite-difference checks of their backward).
// Every array is contiguous and row-major; b is the batch, t the sequence,
// H the indexer's heads of D channels, n the attention heads.

// dsaIndexerLossEps is Megatron's INDEXER_LOSS_EPS (dsa_indexer_loss.py):
// the clamp of the target's row sums and of its logarithm.
const dsaIndexerLossEps = 1e-10

// HadamardTransform is Megatron's rotate_activation (fast_hadamard_transform's
// hadamard_transform(x, scale=d^-0.5)) on n vectors of d channels, d a power
// of two: out = x·H_d·scale with the Sylvester-ordered ±1 matrix H_d. It is
// its own transpose, so the backward is the same transform of the output's
// gradient. out may be x.
func HadamardTransform[F Float](out, x []F, n, d int, scale float64) {
	Parallel(n, max(1, 4096/max(1, d)), func(lo, hi int) {
		buf := make([]float64, d)
		for r := lo; r < hi; r++ {
			for c := range buf {
				buf[c] = float64(x[r*d+c])
			}
			for h := 1; h < d; h *= 2 {
				for i := 0; i < d; i += 2 * h {
					for j := i; j < i+h; j++ {
						a, b := buf[j], buf[j+h]
						buf[j], buf[j+h] = a+b, a-b
					}
				}
			}
			for c, v := range buf {
				out[r*d+c] = F(v * scale)
			}
		}
	})
}

// IndexerScores is the lightning indexer's causal score matrix
// (dsa.py's _compute_index_scores with the causal mask): for query i and
// key j ≤ i of each sequence,
//
//	scores[bi][i][j] = Σ_h w[bi][i][h] · act(q[bi][i][h]·k[bi][j])
//
// with act ReLU (relu) or the identity, and −Inf for j > i. q: (b, t, H,
// D), k: (b, t, D), w: (b, t, H), scores: (b, t, t).
func IndexerScores[F Float](scores, q, k, w []F, b, t, H, D int, relu bool) {
	Parallel(b*t, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			bi, i := r/t, r%t
			row := scores[r*t : (r+1)*t]
			for j := range row {
				if j > i {
					row[j] = F(math.Inf(-1))
					continue
				}
				kj := k[(bi*t+j)*D : (bi*t+j+1)*D]
				var s float64
				for h := range H {
					qh := q[(r*H+h)*D : (r*H+h+1)*D]
					var dot float64
					for c, v := range qh {
						dot += float64(v) * float64(kj[c])
					}
					if relu && dot < 0 {
						dot = 0
					}
					s += float64(w[r*H+h]) * dot
				}
				row[j] = F(s)
			}
		}
	})
}

// IndexerTopK selects each query's k highest-scoring keys (torch.topk over
// the causal scores, k = min(--dsa-indexer-topk, t)): idx (b, t, k) holds the
// key positions by decreasing score (ties: the earlier key first), and −1
// where the row has fewer than k keys of finite score (Megatron's
// masked_fill of the −Inf picks with −1).
func IndexerTopK[F Float](idx []int32, scores []F, b, t, k int) {
	Parallel(b*t, 1, func(lo, hi int) {
		order := make([]int32, t)
		for r := lo; r < hi; r++ {
			row := scores[r*t : (r+1)*t]
			order = order[:0]
			for j, s := range row {
				if !math.IsInf(float64(s), -1) {
					order = append(order, int32(j))
				}
			}
			sort.SliceStable(order, func(a, b int) bool { return row[order[a]] > row[order[b]] })
			out := idx[r*k : (r+1)*k]
			for c := range out {
				out[c] = -1
				if c < len(order) {
					out[c] = order[c]
				}
			}
		}
	})
}

// SparseAttentionForward is attention restricted to the selected keys
// (dsa.py's unfused_dsa_fn / _unfused_absorbed_dsa_fn): for each query row
// and head, a softmax of scale·q·k over the keys idx lists (−1 entries
// skipped) weighs their values. q, k: (b, t, n, dk); v, o: (b, t, n, dv);
// idx: (b, t, K); lse (b, t, n) keeps each row's log-sum-exp for the
// backward (−Inf, and a zero output, for a row with no key).
func SparseAttentionForward[F Float](o, lse, q, k, v []F, idx []int32, b, t, n, dk, dv, K int, scale float64) {
	Parallel(b*t*n, 1, func(lo, hi int) {
		logits := make([]float64, K)
		acc := make([]float64, dv)
		for r := lo; r < hi; r++ {
			bi, i, h := r/(t*n), r/n%t, r%n
			qr := q[r*dk : (r+1)*dk]
			sel := idx[(bi*t+i)*K : (bi*t+i+1)*K]
			m := math.Inf(-1)
			for c, j := range sel {
				if j < 0 {
					continue
				}
				kr := k[((bi*t+int(j))*n+h)*dk:][:dk]
				var dot float64
				for e, x := range qr {
					dot += float64(x) * float64(kr[e])
				}
				logits[c] = dot * scale
				m = max(m, logits[c])
			}
			clear(acc)
			var l float64
			for c, j := range sel {
				if j < 0 {
					continue
				}
				p := math.Exp(logits[c] - m)
				l += p
				vr := v[((bi*t+int(j))*n+h)*dv:][:dv]
				for e, x := range vr {
					acc[e] += p * float64(x)
				}
			}
			out := o[r*dv : (r+1)*dv]
			if l == 0 {
				clear(out)
				lse[r] = F(math.Inf(-1))
				continue
			}
			for e, a := range acc {
				out[e] = F(a / l)
			}
			lse[r] = F(m + math.Log(l))
		}
	})
}

// SparseAttentionBackward adds the gradients of SparseAttentionForward's
// output (do) into dq, dk and dv. The heads run in parallel: each writes
// only its own head's key and value rows.
func SparseAttentionBackward[F Float](dq, dk, dv, do, q, k, v, o, lse []F, idx []int32, b, t, n, dk_, dv_, K int, scale float64) {
	Parallel(b*n, 1, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			bi, h := bh/n, bh%n
			for i := range t {
				r := (bi*t+i)*n + h
				if math.IsInf(float64(lse[r]), -1) {
					continue
				}
				qr, gr, or := q[r*dk_:(r+1)*dk_], do[r*dv_:(r+1)*dv_], o[r*dv_:(r+1)*dv_]
				var delta float64 // Σ_j p_j (do·v_j) = do·o
				for e, g := range gr {
					delta += float64(g) * float64(or[e])
				}
				for _, j := range idx[(bi*t+i)*K : (bi*t+i+1)*K] {
					if j < 0 {
						continue
					}
					kj := ((bi*t+int(j))*n + h)
					kr, vr := k[kj*dk_:(kj+1)*dk_], v[kj*dv_:(kj+1)*dv_]
					var dot, gv float64
					for e, x := range qr {
						dot += float64(x) * float64(kr[e])
					}
					for e, g := range gr {
						gv += float64(g) * float64(vr[e])
					}
					p := math.Exp(dot*scale - float64(lse[r]))
					ds := p * (gv - delta) * scale
					dvr := dv[kj*dv_ : (kj+1)*dv_]
					for e, g := range gr {
						dvr[e] += F(p * float64(g))
					}
					dkr, dqr := dk[kj*dk_:(kj+1)*dk_], dq[r*dk_:(r+1)*dk_]
					for e := range dkr {
						dkr[e] += F(ds * float64(qr[e]))
						dqr[e] += F(ds * float64(kr[e]))
					}
				}
			}
		}
	})
}

// IndexerTargetHeads adds into target (b, t, t) the main attention's
// probabilities summed over this rank's heads (compute_dsa_indexer_loss's
// attention_scores.sum(dim=1), before the tensor-parallel all-reduce): per
// head, the softmax of scale·q·k over the causal keys, or with sparse over
// the causal keys idx selects. q, k: (b, t, n, dk); idx: (b, t, K).
func IndexerTargetHeads[F Float](target, q, k []F, idx []int32, b, t, n, dk, K int, scale float64, sparse bool) {
	Parallel(b*t, 1, func(lo, hi int) {
		valid := make([]bool, t)
		logits := make([]float64, t)
		for r := lo; r < hi; r++ {
			bi, i := r/t, r%t
			indexerValid(valid, idx[r*K:(r+1)*K], i, sparse)
			row := target[r*t : (r+1)*t]
			for h := range n {
				qr := q[(r*n+h)*dk:][:dk]
				m := math.Inf(-1)
				for j := 0; j <= i; j++ {
					if !valid[j] {
						continue
					}
					kr := k[((bi*t+j)*n+h)*dk:][:dk]
					var dot float64
					for e, x := range qr {
						dot += float64(x) * float64(kr[e])
					}
					logits[j] = dot * scale
					m = max(m, logits[j])
				}
				var l float64
				for j := 0; j <= i; j++ {
					if valid[j] {
						logits[j] = math.Exp(logits[j] - m)
						l += logits[j]
					}
				}
				l = max(l, dsaIndexerLossEps) // masked_softmax's clamp
				for j := 0; j <= i; j++ {
					if valid[j] {
						row[j] += F(logits[j] / l)
					}
				}
			}
		}
	})
}

// indexerValid marks the keys of query i that the indexer's loss covers:
// j ≤ i, and with sparse only those sel lists.
func indexerValid(valid []bool, sel []int32, i int, sparse bool) {
	for j := range valid {
		valid[j] = !sparse && j <= i
	}
	if sparse {
		for _, j := range sel {
			if j >= 0 && int(j) <= i {
				valid[j] = true
			}
		}
	}
}

// IndexerLoss is the indexer's KL loss (compute_dsa_indexer_loss and
// indexer_loss_from_target, not yet times the coefficient): the target
// (b, t, t), the heads' summed probabilities over every tensor-parallel
// rank, is L1-normalised per row; the indexer's scores take a log-softmax
// over the same keys (the causal ones, or with sparse the selected causal
// ones); the loss is Σ target·(log(max(target, 1e-10)) − log p) over every
// key and row, divided by the b·t rows unless perToken
// (--calculate-per-token-loss: the sum). It normalises target in place and
// returns the loss; when dlogits (b, t, t) is not nil it also sets it to
// the loss's gradient with respect to the scores (bwd_fused_indexer_loss_naive's
// (softmax − target)/(b·t) on the covered keys, zero elsewhere).
func IndexerLoss[F Float](dlogits, target, scores []F, idx []int32, b, t, K int, sparse, perToken bool) float64 {
	rows := b * t
	div := float64(rows)
	if perToken {
		div = 1
	}
	perRow := make([]float64, rows)
	Parallel(rows, 1, func(lo, hi int) {
		valid := make([]bool, t)
		logp := make([]float64, t)
		for r := lo; r < hi; r++ {
			i := r % t
			indexerValid(valid, idx[r*K:(r+1)*K], i, sparse)
			row, s := target[r*t:(r+1)*t], scores[r*t:(r+1)*t]
			var sum float64
			m := math.Inf(-1)
			for j, ok := range valid {
				if ok {
					sum += float64(row[j])
					m = max(m, float64(s[j]))
				}
			}
			sum = max(sum, dsaIndexerLossEps)
			var l float64
			for j, ok := range valid {
				if ok {
					l += math.Exp(float64(s[j]) - m)
				}
			}
			lse := m + math.Log(l)
			var kl float64
			for j, ok := range valid {
				if !ok {
					row[j] = 0
					continue
				}
				row[j] = F(float64(row[j]) / sum)
				tj := float64(row[j])
				logp[j] = float64(s[j]) - lse
				kl += tj * (math.Log(max(tj, dsaIndexerLossEps)) - logp[j])
			}
			perRow[r] = kl
			if dlogits != nil {
				d := dlogits[r*t : (r+1)*t]
				for j, ok := range valid {
					d[j] = 0
					if ok {
						d[j] = F((math.Exp(logp[j]) - float64(row[j])) / div)
					}
				}
			}
		}
	})
	var loss float64
	for _, v := range perRow {
		loss += v
	}
	return loss / div
}

// IndexerScoresBackward adds into dq (b, t, H, D), dk (b, t, D) and dw (b,
// t, H) the gradients of IndexerScores given the scores' gradient ds
// (b, t, t; its entries for j > i are ignored).
func IndexerScoresBackward[F Float](dq, dk, dw, ds, q, k, w []F, b, t, H, D int, relu bool) {
	// queries and weights: rows in parallel
	Parallel(b*t, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			bi, i := r/t, r%t
			for h := range H {
				qh := q[(r*H+h)*D : (r*H+h+1)*D]
				dqh := dq[(r*H+h)*D : (r*H+h+1)*D]
				wh := float64(w[r*H+h])
				var gw float64
				for j := 0; j <= i; j++ {
					g := float64(ds[r*t+j])
					if g == 0 {
						continue
					}
					kj := k[(bi*t+j)*D : (bi*t+j+1)*D]
					var dot float64
					for c, v := range qh {
						dot += float64(v) * float64(kj[c])
					}
					if relu && dot <= 0 {
						continue // ReLU: no weight term, no gradient (torch's scores > 0)
					}
					gw += g * dot
					for c, v := range kj {
						dqh[c] += F(g * wh * float64(v))
					}
				}
				dw[r*H+h] += F(gw)
			}
		}
	})
	// keys: each key position in parallel, over the queries i ≥ j
	Parallel(b*t, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			bi, j := r/t, r%t
			kj := k[r*D : (r+1)*D]
			dkj := dk[r*D : (r+1)*D]
			for i := j; i < t; i++ {
				qi := bi*t + i
				g := float64(ds[qi*t+j])
				if g == 0 {
					continue
				}
				for h := range H {
					qh := q[(qi*H+h)*D : (qi*H+h+1)*D]
					if relu {
						var dot float64
						for c, v := range qh {
							dot += float64(v) * float64(kj[c])
						}
						if dot <= 0 {
							continue
						}
					}
					a := g * float64(w[qi*H+h])
					for c, v := range qh {
						dkj[c] += F(a * float64(v))
					}
				}
			}
		}
	})
}

// dsaQueryChunk is how many queries the GEMM form of the indexer scores
// at once: its products (chunk·H × t floats) stay a few megabytes.
func dsaQueryChunk(t, H int) int { return max(1, min(t, (1<<22)/max(1, H*t))) }

// IndexerScoresGEMM is IndexerScores in float32 with the products of each
// chunk of queries' heads with every key from Sgemm (the model's path; the
// generic IndexerScores is its float64-checked reference).
func IndexerScoresGEMM(scores, q, k, w []float32, b, t, H, D int, relu bool) {
	c := dsaQueryChunk(t, H)
	p := make([]float32, c*H*t)
	for bi := range b {
		kb := k[bi*t*D : (bi+1)*t*D]
		for i0 := 0; i0 < t; i0 += c {
			n := min(c, t-i0)
			Sgemm(NoTrans, Trans, n*H, t, D, 1, q[(bi*t+i0)*H*D:], D, kb, D, 0, p, t)
			Parallel(n, 1, func(lo, hi int) {
				for r := lo; r < hi; r++ {
					i := i0 + r
					row := scores[(bi*t+i)*t : (bi*t+i+1)*t]
					for j := range row[i+1:] {
						row[i+1+j] = float32(math.Inf(-1))
					}
					clear(row[:i+1])
					for h := range H {
						wh := w[(bi*t+i)*H+h]
						for j, v := range p[(r*H+h)*t : (r*H+h)*t+i+1] {
							if relu && v < 0 {
								continue
							}
							row[j] += wh * v
						}
					}
				}
			})
		}
	}
}

// IndexerScoresBackwardGEMM is IndexerScoresBackward in float32 with
// Sgemm (IndexerScoresGEMM's backward): the products are recomputed per
// chunk of queries.
func IndexerScoresBackwardGEMM(dq, dk, dw, ds, q, k, w []float32, b, t, H, D int, relu bool) {
	c := dsaQueryChunk(t, H)
	p := make([]float32, c*H*t)
	for bi := range b {
		kb, dkb := k[bi*t*D:(bi+1)*t*D], dk[bi*t*D:(bi+1)*t*D]
		for i0 := 0; i0 < t; i0 += c {
			n := min(c, t-i0)
			qc := q[(bi*t+i0)*H*D:]
			Sgemm(NoTrans, Trans, n*H, t, D, 1, qc, D, kb, D, 0, p, t)
			// p ← the products' gradient ds·w (·relu'), dw from the products
			Parallel(n, 1, func(lo, hi int) {
				for r := lo; r < hi; r++ {
					i := i0 + r
					g := ds[(bi*t+i)*t : (bi*t+i)*t+i+1]
					for h := range H {
						pr := p[(r*H+h)*t : (r*H+h+1)*t]
						wh := w[(bi*t+i)*H+h]
						var gw float32
						for j, v := range pr[:i+1] {
							if relu && v <= 0 {
								pr[j] = 0
								continue
							}
							gw += g[j] * v
							pr[j] = g[j] * wh
						}
						clear(pr[i+1:])
						dw[(bi*t+i)*H+h] += gw
					}
				}
			})
			Sgemm(NoTrans, NoTrans, n*H, D, t, 1, p, t, kb, D, 1, dq[(bi*t+i0)*H*D:], D)
			Sgemm(Trans, NoTrans, t, D, n*H, 1, p, t, qc, D, 1, dkb, D)
		}
	}
}
