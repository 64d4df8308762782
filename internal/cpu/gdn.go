package cpu

import "math"

// The kernels of Megatron's gated delta net layer (megatron/core/ssm/
// gated_delta_net: GatedDeltaNet, the "linear attention" of Qwen3-Next),
// written once for float32 (the model) and float64 (the finite-difference
// checks of their backward). Every array is contiguous and row-major.

// Float is the element type of the gated delta net kernels.
type Float interface{ ~float32 | ~float64 }

// CausalConvSiLUForward is the layer's short convolution: a causal
// depthwise conv1d over time (PyTorch's F.conv1d with groups = channels,
// padding k-1, the first t outputs) followed by SiLU, as GatedDeltaNet's
// deterministic path. x, out: (b, t, c); w: (c, k), w[ch][k-1] weighs the
// current step:
//
//	out[i][s][ch] = silu(Σ_j w[ch][j] · x[i][s-(k-1)+j][ch])   (x before 0 is 0)
func CausalConvSiLUForward[F Float](out, x, w []F, b, t, c, k int) {
	Parallel(b*t, max(1, 4096/max(1, c*k)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			i, s := r/t, r%t
			o := out[r*c : (r+1)*c]
			for ch := range o {
				o[ch] = convAt(x, w, i, s, ch, t, c, k)
			}
			for ch, p := range o {
				o[ch] = p / (1 + F(math.Exp(-float64(p))))
			}
		}
	})
}

// convAt is the convolution (before SiLU) at batch row i, step s, channel ch.
func convAt[F Float](x, w []F, i, s, ch, t, c, k int) F {
	var acc F
	for j := range k {
		if src := s - (k - 1) + j; src >= 0 {
			acc += w[ch*k+j] * x[(i*t+src)*c+ch]
		}
	}
	return acc
}

// CausalConvSiLUBackward accumulates into dx (b, t, c) and dw (c, k) the
// gradients of CausalConvSiLUForward given dout; it recomputes the
// convolution from x and w.
func CausalConvSiLUBackward[F Float](dx, dw, dout, x, w []F, b, t, c, k int) {
	dpre := make([]F, b*t*c)
	Parallel(b*t, max(1, 4096/max(1, c*k)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			i, s := r/t, r%t
			for ch := range c {
				p := float64(convAt(x, w, i, s, ch, t, c, k))
				sg := 1 / (1 + math.Exp(-p))
				dpre[r*c+ch] = dout[r*c+ch] * F(sg*(1+p*(1-sg)))
			}
		}
	})
	// dx[s] = Σ_j w[j]·dpre[s+(k-1)-j]; split by batch row and channel so
	// every element has one writer
	Parallel(b*c, 1, func(lo, hi int) {
		for q := lo; q < hi; q++ {
			i, ch := q/c, q%c
			for s := range t {
				var acc F
				for j := range k {
					if dst := s + (k - 1) - j; dst < t {
						acc += w[ch*k+j] * dpre[(i*t+dst)*c+ch]
					}
				}
				dx[(i*t+s)*c+ch] += acc
			}
		}
	})
	Parallel(c, 1, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			for j := range k {
				var acc F
				for i := range b {
					for s := range t {
						if src := s - (k - 1) + j; src >= 0 {
							acc += dpre[(i*t+s)*c+ch] * x[(i*t+src)*c+ch]
						}
					}
				}
				dw[ch*k+j] += acc
			}
		}
	})
}

// L2NormForward normalises each row of d values of x (n rows) to unit
// length as FLA's l2norm: out = x / sqrt(Σx² + eps).
func L2NormForward[F Float](out, x []F, n, d int, eps float64) {
	Parallel(n, max(1, 4096/max(1, d)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := x[r*d : (r+1)*d]
			var ss float64
			for _, v := range row {
				ss += float64(v) * float64(v)
			}
			inv := F(1 / math.Sqrt(ss+eps))
			for j, v := range row {
				out[r*d+j] = v * inv
			}
		}
	})
}

// L2NormBackward accumulates into dx the gradient of L2NormForward:
// dx = (dy - y·(y·dy)) / sqrt(Σx² + eps).
func L2NormBackward[F Float](dx, dy, x []F, n, d int, eps float64) {
	Parallel(n, max(1, 4096/max(1, d)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row, g := x[r*d:(r+1)*d], dy[r*d:(r+1)*d]
			var ss float64
			for _, v := range row {
				ss += float64(v) * float64(v)
			}
			inv := 1 / math.Sqrt(ss+eps)
			var dot float64 // y·dy
			for j, v := range row {
				dot += float64(v) * inv * float64(g[j])
			}
			for j, v := range row {
				dx[r*d+j] += F(inv * (float64(g[j]) - float64(v)*inv*dot))
			}
		}
	})
}

// softplus is PyTorch's F.softplus (beta 1, threshold 20).
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// GDNGatesForward computes GatedDeltaNet's per-head gates for n tokens of h
// heads: the log-decay g = -exp(aLog)·softplus(alpha + dtBias) and the
// write strength beta = sigmoid(b). alpha, b, g, beta: (n, h); aLog,
// dtBias: (h).
func GDNGatesForward[F Float](g, beta, alpha, b, aLog, dtBias []F, n, h int) {
	for r := range n {
		for j := range h {
			i := r*h + j
			g[i] = F(-math.Exp(float64(aLog[j])) * softplus(float64(alpha[i]+dtBias[j])))
			beta[i] = F(1 / (1 + math.Exp(-float64(b[i]))))
		}
	}
}

// GDNGatesBackward accumulates into dalpha, db, daLog and ddtBias the
// gradients of GDNGatesForward given dg and dbeta.
func GDNGatesBackward[F Float](dalpha, db, daLog, ddtBias, dg, dbeta, alpha, b, aLog, dtBias []F, n, h int) {
	for r := range n {
		for j := range h {
			i := r*h + j
			a := math.Exp(float64(aLog[j]))
			z := float64(alpha[i] + dtBias[j])
			dsp := 1.0 // softplus' = sigmoid, 1 past the threshold
			if z <= 20 {
				dsp = 1 / (1 + math.Exp(-z))
			}
			dz := -float64(dg[i]) * a * dsp
			dalpha[i] += F(dz)
			ddtBias[j] += F(dz)
			daLog[j] += F(-float64(dg[i]) * a * softplus(z)) // ∂g/∂aLog = g
			sg := 1 / (1 + math.Exp(-float64(b[i])))
			db[i] += F(float64(dbeta[i]) * sg * (1 - sg))
		}
	}
}

// DeltaRuleShape is the shape of a gated delta rule: q, k (b, t, heads,
// dk); v, out (b, t, heads, dv); g, beta (b, t, heads). Scale multiplies
// the queries (1/sqrt(dk) in Megatron). Chunk is how many steps the
// backward recomputes from one saved state (the forward saves the state
// every Chunk steps).
type DeltaRuleShape struct {
	B, T, Heads, DK, DV int
	Scale               float64
	Chunk               int
}

// SavedStates is the number of values GatedDeltaRuleForward saves for the
// backward: one dk×dv state per (sequence, head) every Chunk steps.
func (s DeltaRuleShape) SavedStates() int {
	return s.B * s.Heads * ((s.T + s.Chunk - 1) / s.Chunk) * s.DK * s.DV
}

// GatedDeltaRuleForward runs the gated delta rule recurrently, as the
// naive reference of FLA's chunked kernel (and Megatron's
// torch_chunk_gated_delta_rule, its chunked form): per sequence and head,
// with a state S (dk×dv) starting at zero, for each step
//
//	S ← exp(g)·S;  S ← S + k·(beta·(v − Sᵀk))ᵀ;  out = Sᵀ(scale·q)
//
// saved receives the state before steps 0, Chunk, 2·Chunk, ... (len
// SavedStates). The cost is O(b·t·heads·dk·dv) time and the saved states'
// memory; (sequence, head) pairs run in parallel.
func GatedDeltaRuleForward[F Float](out, saved, q, k, v, g, beta []F, s DeltaRuleShape) {
	nc := (s.T + s.Chunk - 1) / s.Chunk
	Parallel(s.B*s.Heads, 1, func(lo, hi int) {
		S := make([]F, s.DK*s.DV)
		u := make([]F, s.DV)
		for p := lo; p < hi; p++ {
			i, h := p/s.Heads, p%s.Heads
			clear(S)
			for t := range s.T {
				if t%s.Chunk == 0 {
					copy(saved[(p*nc+t/s.Chunk)*s.DK*s.DV:], S)
				}
				deltaStep(S, u, out, q, k, v, g, beta, &s, i, t, h)
			}
		}
	})
}

// deltaStep advances S by step t of sequence i, head h, and writes the
// step's output (when out is not nil), in two passes over S: u = Sᵀk·exp(g)
// then, row by row, S ← exp(g)·S + k·δᵀ and out += S·(scale·q).
func deltaStep[F Float](S, u, out, q, k, v, g, beta []F, s *DeltaRuleShape, i, t, h int) {
	dk, dv := s.DK, s.DV
	row := (i*s.T+t)*s.Heads + h
	kt, vt := k[row*dk:(row+1)*dk], v[row*dv:(row+1)*dv]
	decay := F(math.Exp(float64(g[row])))
	clear(u)
	for a := range dk {
		ka := kt[a] * decay
		for c, x := range S[a*dv : (a+1)*dv] {
			u[c] += x * ka
		}
	}
	bt := beta[row]
	for c := range u {
		u[c] = bt * (vt[c] - u[c]) // δ
	}
	var o, qt []F
	if out != nil {
		qt = q[row*dk : (row+1)*dk]
		o = out[row*dv : (row+1)*dv]
		clear(o)
	}
	sc := F(s.Scale)
	for a := range dk {
		ka := kt[a]
		sr := S[a*dv : (a+1)*dv]
		if o == nil {
			for c := range sr {
				sr[c] = sr[c]*decay + ka*u[c]
			}
			continue
		}
		qa := qt[a] * sc
		for c := range sr {
			x := sr[c]*decay + ka*u[c]
			sr[c] = x
			o[c] += x * qa
		}
	}
}

// GatedDeltaRuleBackward accumulates into dq, dk, dv, dg and dbeta the
// gradients of GatedDeltaRuleForward given dout and its saved states. It
// walks each (sequence, head) backwards a chunk at a time, recomputing the
// chunk's states from the saved one: twice the forward's arithmetic.
func GatedDeltaRuleBackward[F Float](dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta []F, s DeltaRuleShape) {
	nc := (s.T + s.Chunk - 1) / s.Chunk
	DK, DV := s.DK, s.DV
	Parallel(s.B*s.Heads, 1, func(lo, hi int) {
		states := make([]F, (s.Chunk+1)*DK*DV) // S before each step of the chunk, and after its last
		dS := make([]F, DK*DV)
		u := make([]F, DV)
		delta := make([]F, DV)
		ddelta := make([]F, DV)
		sc := F(s.Scale)
		for p := lo; p < hi; p++ {
			i, h := p/s.Heads, p%s.Heads
			clear(dS)
			for c := nc - 1; c >= 0; c-- {
				t0, t1 := c*s.Chunk, min((c+1)*s.Chunk, s.T)
				copy(states[:DK*DV], saved[(p*nc+c)*DK*DV:(p*nc+c+1)*DK*DV])
				for t := t0; t < t1; t++ {
					j := t - t0
					next := states[(j+1)*DK*DV : (j+2)*DK*DV]
					copy(next, states[j*DK*DV:(j+1)*DK*DV])
					deltaStep(next, u, nil, q, k, v, g, beta, &s, i, t, h)
				}
				for t := t1 - 1; t >= t0; t-- {
					j := t - t0
					prev := states[j*DK*DV : (j+1)*DK*DV]
					cur := states[(j+1)*DK*DV : (j+2)*DK*DV]
					row := (i*s.T+t)*s.Heads + h
					qt, kt, vt := q[row*DK:(row+1)*DK], k[row*DK:(row+1)*DK], v[row*DV:(row+1)*DV]
					do := dout[row*DV : (row+1)*DV]
					decay := F(math.Exp(float64(g[row])))
					bt := beta[row]
					// out = curᵀ(sc·q): dS += sc·q·doᵀ, dq = sc·cur·do;
					// and u = Aᵀk with A = decay·prev
					clear(u)
					for a := range DK {
						var acc F
						sr, dr, pr := cur[a*DV:(a+1)*DV], dS[a*DV:(a+1)*DV], prev[a*DV:(a+1)*DV]
						qa, ka := sc*qt[a], decay*kt[a]
						for c2 := range sr {
							acc += sr[c2] * do[c2]
							dr[c2] += qa * do[c2]
							u[c2] += pr[c2] * ka
						}
						dq[row*DK+a] += sc * acc
					}
					for c2 := range u {
						delta[c2] = bt * (vt[c2] - u[c2]) // δ = β(v − u)
					}
					// cur = A + k·δᵀ: dA = dS; dk += dS·δ; dδ = dSᵀk
					clear(ddelta)
					for a := range DK {
						var acc F
						dr, ka := dS[a*DV:(a+1)*DV], kt[a]
						for c2 := range dr {
							acc += dr[c2] * delta[c2]
							ddelta[c2] += dr[c2] * ka
						}
						dk[row*DK+a] += acc
					}
					var dbt F
					for c2 := range ddelta {
						dbt += ddelta[c2] * (vt[c2] - u[c2])
						dv[row*DV+c2] += bt * ddelta[c2]
						ddelta[c2] *= -bt // now du
					}
					dbeta[row] += dbt
					// u = Aᵀk: dA += k·duᵀ, dk += A·du; A = decay·prev:
					// dg = Σ A⊙dA, dprev = decay·dA
					var dgt F
					for a := range DK {
						var acc F
						dr, pr, ka := dS[a*DV:(a+1)*DV], prev[a*DV:(a+1)*DV], kt[a]
						for c2 := range dr {
							x := dr[c2] + ka*ddelta[c2] // dA
							ap := decay * pr[c2]
							acc += ap * ddelta[c2]
							dgt += ap * x
							dr[c2] = decay * x
						}
						dk[row*DK+a] += acc
					}
					dg[row] += dgt
				}
			}
		}
	})
}

// CausalConvSiLUStateForward is CausalConvSiLUForward of one sequence's
// next t steps x (t, c) continuing from state (k-1, c), the k-1 inputs
// before them, oldest first (zeros before the sequence's start): decoding,
// which keeps the state between calls. It writes out (t, c) and leaves in
// state the last k-1 inputs. The sum runs in CausalConvSiLUForward's
// order, so a sequence convolved in pieces gets the bits of one call.
func CausalConvSiLUStateForward[F Float](out, x, w, state []F, t, c, k int) {
	h := k - 1
	at := func(s, ch int) F { // input s of the window: state before step 0
		if s < 0 {
			return state[(h+s)*c+ch]
		}
		return x[s*c+ch]
	}
	for s := range t {
		o := out[s*c : (s+1)*c]
		for ch := range o {
			var acc F
			for j := range k {
				acc += w[ch*k+j] * at(s-h+j, ch)
			}
			o[ch] = acc / (1 + F(math.Exp(-float64(acc))))
		}
	}
	if h == 0 {
		return
	}
	// the new window: the last h of state followed by x
	if t >= h {
		copy(state, x[(t-h)*c:t*c])
		return
	}
	copy(state, state[t*c:])
	copy(state[(h-t)*c:], x[:t*c])
}

// GatedDeltaRuleStateForward runs GatedDeltaRuleForward's recurrence over
// one sequence's next steps (s.B must be 1; q, k already repeated to
// s.Heads) from the states S (heads, dk, dv), which it leaves at the last
// step's: decoding, which keeps the state between calls. Each step is
// GatedDeltaRuleForward's arithmetic, so a sequence run in pieces gets the
// bits of one call.
func GatedDeltaRuleStateForward[F Float](out, S, q, k, v, g, beta []F, s DeltaRuleShape) {
	n := s.DK * s.DV
	Parallel(s.Heads, 1, func(lo, hi int) {
		u := make([]F, s.DV)
		for h := lo; h < hi; h++ {
			for t := range s.T {
				deltaStep(S[h*n:(h+1)*n], u, out, q, k, v, g, beta, &s, 0, t, h)
			}
		}
	})
}
