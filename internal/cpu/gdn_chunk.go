package cpu

import "math"

// The gated delta rule in its chunked (WY) form, as Megatron's
// torch_chunk_gated_delta_rule and FLA's chunk kernels compute it: the
// same function as GatedDeltaRuleForward's recurrence, which stays the
// reference. Per (sequence, head) and chunk of L ≤ s.Chunk steps, with the
// state S (dk×dv) before the chunk, G the cumulative sum of g inside the
// chunk, D[i][j] = exp(G_i − G_j), Kβ = diag(β)K, Vβ = diag(β)V:
//
//	M = (Kβ·Kᵀ ⊙ D) strictly below the diagonal;  T = (I + M)⁻¹
//	U = T·Vβ;  W = T·diag(exp G)·Kβ
//	Vn = U − W·S   (the chunk's corrected values)
//	O = diag(exp G)·(scale·Q)·S + ((scale·Q)·Kᵀ ⊙ D, on and below the diagonal)·Vn
//	S ← exp(G_L)·S + (diag(exp(G_L − G))·K)ᵀ·Vn
//
// The products run through Sgemm's kernels (float32; loops in float64,
// the finite-difference checks), one (sequence, head) pair per goroutine:
// matrix products over a chunk instead of a pass over S per token. The
// backward walks the chunks in reverse from the state saved before each
// (GatedDeltaRuleForward's saved layout, Chunk = the chunk size),
// recomputing the chunk's T, U, W and Vn.

// mm is c = alpha·op(a)·op(b) + beta·c on row-major matrices: op(a) m×k,
// op(b) k×n, leading dimensions lda, ldb, ldc. float32 goes through the
// GEMM kernels on this goroutine (the caller runs pairs in parallel).
func mm[F Float](tA, tB bool, m, n, k int, alpha F, a []F, lda int, b []F, ldb int, beta F, c []F, ldc int) {
	if a32, ok := any(a).([]float32); ok {
		sgemmStrided(false, 1, Transpose(tA), Transpose(tB), m, n, k, float32(alpha), a32, lda, 0,
			any(b).([]float32), ldb, 0, float32(beta), any(c).([]float32), ldc, 0, 1)
		return
	}
	for i := range m {
		for j := range n {
			var acc F
			for p := range k {
				ai, bi := i*lda+p, p*ldb+j
				if tA {
					ai = p*lda + i
				}
				if tB {
					bi = j*ldb + p
				}
				acc += a[ai] * b[bi]
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * acc
			} else {
				c[i*ldc+j] = alpha*acc + beta*c[i*ldc+j]
			}
		}
	}
}

// chunkWork is one goroutine's buffers for a chunk (C = s.Chunk rows).
type chunkWork[F Float] struct {
	s                         *DeltaRuleShape
	L                         int // steps in the current chunk
	G, eG, eGL, bt            []F // C: cumulative log-decay, exp(G), exp(G_L − G), beta
	Qs, Kc, Vc, Kb, Vb, E, Kd []F // C×dk or C×dv
	QE                        []F // diag(exp G)·Qs
	M, T, P                   []F // C×C
	U, W, Vn, O               []F
	S                         []F // dk×dv
	// backward
	dS, dO, dVn, dP, X, dQs, dKc, dKd, dW, dT, dVb, dE, dKb, tmp, dG []F
}

func newChunkWork[F Float](s *DeltaRuleShape, backward bool) *chunkWork[F] {
	C, dk, dv := s.Chunk, s.DK, s.DV
	w := &chunkWork[F]{s: s}
	mk := func(n int) []F { return make([]F, n) }
	w.G, w.eG, w.eGL, w.bt = mk(C), mk(C), mk(C), mk(C)
	w.Qs, w.Kc, w.Kb, w.E, w.Kd, w.QE, w.W = mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk)
	w.Vc, w.Vb, w.U, w.Vn, w.O = mk(C*dv), mk(C*dv), mk(C*dv), mk(C*dv), mk(C*dv)
	w.M, w.T, w.P = mk(C*C), mk(C*C), mk(C*C)
	w.S = mk(dk * dv)
	if backward {
		w.dS, w.tmp = mk(dk*dv), mk(max(dk*dv, C*C))
		w.dO, w.dVn, w.dVb = mk(C*dv), mk(C*dv), mk(C*dv)
		w.dP, w.dT = mk(C*C), mk(C*C)
		w.X, w.dQs, w.dKc, w.dKd, w.dW, w.dE, w.dKb = mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk), mk(C*dk)
		w.dG = mk(C)
	}
	return w
}

// load reads the chunk of L steps from t0 of sequence i, head h, and
// computes what depends on the inputs alone: G, the scaled and weighted
// rows, and M, T, U, W.
func (w *chunkWork[F]) load(q, k, v, g, beta []F, i, h, t0, L int) {
	s := w.s
	dk, dv := s.DK, s.DV
	w.L = L
	sc := F(s.Scale)
	var acc F
	for t := range L {
		row := (i*s.T+t0+t)*s.Heads + h
		acc += g[row]
		w.G[t], w.bt[t] = acc, beta[row]
		for a, x := range q[row*dk : (row+1)*dk] {
			w.Qs[t*dk+a] = sc * x
		}
		copy(w.Kc[t*dk:(t+1)*dk], k[row*dk:(row+1)*dk])
		copy(w.Vc[t*dv:(t+1)*dv], v[row*dv:(row+1)*dv])
	}
	GL := w.G[L-1]
	for t := range L {
		w.eG[t] = F(math.Exp(float64(w.G[t])))
		w.eGL[t] = F(math.Exp(float64(GL - w.G[t])))
		b, e, el := w.bt[t], w.eG[t], w.eGL[t]
		for a := range dk {
			x := w.Kc[t*dk+a]
			w.Kb[t*dk+a] = b * x
			w.E[t*dk+a] = e * b * x
			w.Kd[t*dk+a] = el * x
			w.QE[t*dk+a] = e * w.Qs[t*dk+a]
		}
		for c := range dv {
			w.Vb[t*dv+c] = b * w.Vc[t*dv+c]
		}
	}
	// M = Kβ·Kᵀ ⊙ D strictly below the diagonal (ld L)
	mm(false, true, L, L, dk, 1, w.Kb, dk, w.Kc, dk, 0, w.M, L)
	for a := range L {
		for b := range L {
			if b < a {
				w.M[a*L+b] *= F(math.Exp(float64(w.G[a] - w.G[b])))
			} else {
				w.M[a*L+b] = 0
			}
		}
	}
	// T = (I + M)⁻¹ by forward substitution, row by row as Megatron's
	// loop: T[a][b] = −M[a][b] − Σ_{b<m<a} M[a][m]·T[m][b]
	T := w.T[:L*L]
	clear(T)
	for a := range L {
		T[a*L+a] = 1
		for b := range a {
			x := -w.M[a*L+b]
			for m := b + 1; m < a; m++ {
				x -= w.M[a*L+m] * T[m*L+b]
			}
			T[a*L+b] = x
		}
	}
	mm(false, false, L, dv, L, 1, T, L, w.Vb, dv, 0, w.U, dv)
	mm(false, false, L, dk, L, 1, T, L, w.E, dk, 0, w.W, dk)
}

// forward computes Vn, P and O from w.S (the state before the chunk).
func (w *chunkWork[F]) forward() {
	s, L := w.s, w.L
	dk, dv := s.DK, s.DV
	copy(w.Vn[:L*dv], w.U[:L*dv])
	mm(false, false, L, dv, dk, -1, w.W, dk, w.S, dv, 1, w.Vn, dv)
	mm(false, true, L, L, dk, 1, w.Qs, dk, w.Kc, dk, 0, w.P, L)
	for a := range L {
		for b := range L {
			if b <= a {
				w.P[a*L+b] *= F(math.Exp(float64(w.G[a] - w.G[b])))
			} else {
				w.P[a*L+b] = 0
			}
		}
	}
	mm(false, false, L, dv, dk, 1, w.QE, dk, w.S, dv, 0, w.O, dv)
	mm(false, false, L, dv, L, 1, w.P, L, w.Vn, dv, 1, w.O, dv)
}

// advance moves w.S past the chunk (after forward).
func (w *chunkWork[F]) advance() {
	s, L := w.s, w.L
	e := w.eG[L-1]
	for j := range w.S {
		w.S[j] *= e
	}
	mm(true, false, s.DK, s.DV, L, 1, w.Kd, s.DK, w.Vn, s.DV, 1, w.S, s.DV)
}

// GatedDeltaRuleChunkedForward is GatedDeltaRuleForward (the same
// arguments, out and saved) computed chunk by chunk in the WY form, s.Chunk
// steps a chunk.
func GatedDeltaRuleChunkedForward[F Float](out, saved, q, k, v, g, beta []F, s DeltaRuleShape) {
	nc := (s.T + s.Chunk - 1) / s.Chunk
	n := s.DK * s.DV
	Parallel(s.B*s.Heads, 1, func(lo, hi int) {
		w := newChunkWork[F](&s, false)
		for p := lo; p < hi; p++ {
			i, h := p/s.Heads, p%s.Heads
			clear(w.S)
			for c := range nc {
				copy(saved[(p*nc+c)*n:(p*nc+c+1)*n], w.S)
				t0 := c * s.Chunk
				L := min(s.Chunk, s.T-t0)
				w.load(q, k, v, g, beta, i, h, t0, L)
				w.forward()
				for t := range L {
					row := (i*s.T+t0+t)*s.Heads + h
					copy(out[row*s.DV:(row+1)*s.DV], w.O[t*s.DV:(t+1)*s.DV])
				}
				if c < nc-1 {
					w.advance()
				}
			}
		}
	})
}

// GatedDeltaRuleChunkedBackward accumulates into dq, dk, dv, dg and dbeta
// the gradients of GatedDeltaRuleChunkedForward (or GatedDeltaRuleForward
// with the same Chunk: the saved states are the same) given dout.
func GatedDeltaRuleChunkedBackward[F Float](dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta []F, s DeltaRuleShape) {
	nc := (s.T + s.Chunk - 1) / s.Chunk
	DK, DV := s.DK, s.DV
	n := DK * DV
	Parallel(s.B*s.Heads, 1, func(lo, hi int) {
		w := newChunkWork[F](&s, true)
		for p := lo; p < hi; p++ {
			i, h := p/s.Heads, p%s.Heads
			clear(w.dS) // the loss's gradient of the last state: none
			for c := nc - 1; c >= 0; c-- {
				t0 := c * s.Chunk
				L := min(s.Chunk, s.T-t0)
				copy(w.S, saved[(p*nc+c)*n:(p*nc+c+1)*n])
				w.load(q, k, v, g, beta, i, h, t0, L)
				w.forward()
				for t := range L {
					row := (i*s.T+t0+t)*s.Heads + h
					copy(w.dO[t*DV:(t+1)*DV], dout[row*DV:(row+1)*DV])
				}
				w.backward()
				sc := F(s.Scale)
				var acc F // dg is the reverse cumulative sum of dG
				for t := L - 1; t >= 0; t-- {
					row := (i*s.T+t0+t)*s.Heads + h
					acc += w.dG[t]
					dg[row] += acc
					var db F
					for a := range DK {
						dq[row*DK+a] += sc * w.dQs[t*DK+a]
						dk[row*DK+a] += w.dKc[t*DK+a]
						db += w.Kc[t*DK+a] * w.dKb[t*DK+a]
					}
					for c2 := range DV {
						dv[row*DV+c2] += w.bt[t] * w.dVb[t*DV+c2]
						db += w.Vc[t*DV+c2] * w.dVb[t*DV+c2]
					}
					dbeta[row] += db
				}
			}
		}
	})
}

// backward takes w.dO and w.dS (the gradient of the state after the
// chunk) and leaves dG (of the cumulative log-decays), dQs (of the scaled
// queries), dKc (of the keys, all paths), dKb and dVb (of the β-weighted
// rows, β's share still to apply) and in dS the gradient of the state
// before the chunk.
func (w *chunkWork[F]) backward() {
	s, L := w.s, w.L
	dk, dv := s.DK, s.DV
	dG := w.dG[:L]
	clear(dG)
	// dVn = Pᵀ·dO + Kd·dS
	mm(true, false, L, dv, L, 1, w.P, L, w.dO, dv, 0, w.dVn, dv)
	mm(false, false, L, dv, dk, 1, w.Kd, dk, w.dS, dv, 1, w.dVn, dv)
	// dP = dO·Vnᵀ on and below the diagonal; D's share of dG; then dP ⊙ D
	mm(false, true, L, L, dv, 1, w.dO, dv, w.Vn, dv, 0, w.dP, L)
	for a := range L {
		for b := range L {
			if b > a {
				w.dP[a*L+b] = 0
				continue
			}
			r := w.dP[a*L+b] * w.P[a*L+b]
			dG[a] += r
			dG[b] -= r
			w.dP[a*L+b] *= F(math.Exp(float64(w.G[a] - w.G[b])))
		}
	}
	// X = dO·Sᵀ: the gradient of QE; dQs = exp(G)·X + (dP⊙D)·K
	mm(false, true, L, dk, dv, 1, w.dO, dv, w.S, dv, 0, w.X, dk)
	for t := range L {
		var d F
		for a := range dk {
			x := w.X[t*dk+a]
			d += x * w.QE[t*dk+a]
			w.dQs[t*dk+a] = w.eG[t] * x
		}
		dG[t] += d
	}
	mm(false, false, L, dk, L, 1, w.dP, L, w.Kc, dk, 1, w.dQs, dk)
	mm(true, false, L, dk, L, 1, w.dP, L, w.Qs, dk, 0, w.dKc, dk)
	// the state after: exp(G_L)·S + Kdᵀ·Vn
	var sd F
	for j, x := range w.S {
		sd += x * w.dS[j]
	}
	dG[L-1] += w.eG[L-1] * sd
	mm(false, true, L, dk, dv, 1, w.Vn, dv, w.dS, dv, 0, w.dKd, dk)
	for t := range L {
		var r F
		for a := range dk {
			x := w.dKd[t*dk+a]
			r += x * w.Kd[t*dk+a]
			w.dKc[t*dk+a] += w.eGL[t] * x
		}
		dG[L-1] += r
		dG[t] -= r
	}
	// dW = −dVn·Sᵀ, before dS is overwritten
	mm(false, true, L, dk, dv, -1, w.dVn, dv, w.S, dv, 0, w.dW, dk)
	// the state before: exp(G_L)·dS + QEᵀ·dO − Wᵀ·dVn
	e := w.eG[L-1]
	for j := range w.dS {
		w.dS[j] *= e
	}
	mm(true, false, dk, dv, L, 1, w.QE, dk, w.dO, dv, 1, w.dS, dv)
	mm(true, false, dk, dv, L, -1, w.W, dk, w.dVn, dv, 1, w.dS, dv)
	// U = T·Vβ, W = T·E: dT, dVβ = Tᵀ·dVn, dE = Tᵀ·dW
	T := w.T[:L*L]
	mm(false, true, L, L, dv, 1, w.dVn, dv, w.Vb, dv, 0, w.dT, L)
	mm(false, true, L, L, dk, 1, w.dW, dk, w.E, dk, 1, w.dT, L)
	mm(true, false, L, dv, L, 1, T, L, w.dVn, dv, 0, w.dVb, dv)
	mm(true, false, L, dk, L, 1, T, L, w.dW, dk, 0, w.dE, dk)
	// E = exp(G)·Kβ
	for t := range L {
		var d F
		for a := range dk {
			x := w.dE[t*dk+a]
			d += x * w.E[t*dk+a]
			w.dKb[t*dk+a] = w.eG[t] * x
		}
		dG[t] += d
	}
	// T = (I + M)⁻¹: dM = −Tᵀ·dT·Tᵀ, strictly below the diagonal
	mm(false, true, L, L, L, 1, w.dT, L, T, L, 0, w.tmp, L)
	dM := w.dT // dT is done
	mm(true, false, L, L, L, -1, T, L, w.tmp, L, 0, dM, L)
	// M = Kβ·Kᵀ ⊙ D: D's share of dG, then dKK = dM ⊙ D
	for a := range L {
		for b := range L {
			if b >= a {
				dM[a*L+b] = 0
				continue
			}
			r := dM[a*L+b] * w.M[a*L+b]
			dG[a] += r
			dG[b] -= r
			dM[a*L+b] *= F(math.Exp(float64(w.G[a] - w.G[b])))
		}
	}
	mm(false, false, L, dk, L, 1, dM, L, w.Kc, dk, 1, w.dKb, dk)
	mm(true, false, L, dk, L, 1, dM, L, w.Kb, dk, 1, w.dKc, dk)
	// Kβ = β·K: K's share
	for t := range L {
		b := w.bt[t]
		for a := range dk {
			w.dKc[t*dk+a] += b * w.dKb[t*dk+a]
		}
	}
}
