package cpu

import "math"

// attnAllowed reports whether query i may attend to key j in batch b.
func attnAllowed(cfg *AttentionConfig, b, i, j int) bool {
	if cfg.Causal && j+cfg.KPos > i+cfg.QPos {
		return false
	}
	return cfg.DocIDs == nil || cfg.DocIDs[b*cfg.T+i] == cfg.DocIDs[b*cfg.T+j]
}

// attnKeep is the spec of the attention dropout masks: whether the dropout
// of cfg keeps probability (b, i, j) of local query head h, whose global
// index is cfg.FirstHead+h. One hash per element; attnDropTile computes the
// same function a tile at a time.
func attnKeep(cfg *AttentionConfig, b, h, i, j int) bool {
	i, j = i+cfg.QPos, j+cfg.KPos // keyed by sequence position
	x := attnPairBits(attnRowKey(cfg.DropoutSeed, b, cfg.FirstHead+h, i), j/2)
	if j%2 == 1 {
		x >>= 32
	}
	return uint32(x) >= cfg.dropThreshold()
}

// attnDropRef is the float64 dropout multiplier z_ij of cfg: 1 without
// dropout, else 0 (dropped) or 1/(1-p) (kept).
func attnDropRef(cfg *AttentionConfig, b, h, i, j int) float64 {
	switch {
	case cfg.Dropout == 0:
		return 1
	case attnKeep(cfg, b, h, i, j):
		return 1 / (1 - float64(cfg.Dropout))
	}
	return 0
}

// attentionForwardRef is the float64 reference for AttentionForward: the full
// score row is materialised, softmaxed, multiplied by the dropout multipliers
// and by v.
func attentionForwardRef(out, lse, q, k, v []float64, cfg AttentionConfig) {
	T, D := cfg.T, cfg.D
	qs, kvs, grp := cfg.HQ*D, cfg.HKV*D, cfg.HQ/cfg.HKV
	scale := float64(cfg.scale())
	p := make([]float64, T)
	for b := 0; b < cfg.B; b++ {
		for h := 0; h < cfg.HQ; h++ {
			g := h / grp
			for i := 0; i < T; i++ {
				qi := q[(b*T+i)*qs+h*D:][:D]
				m := math.Inf(-1)
				for j := 0; j < T; j++ {
					p[j] = math.Inf(-1)
					if attnAllowed(&cfg, b, i, j) {
						s := 0.0
						for d := 0; d < D; d++ {
							s += qi[d] * k[(b*T+j)*kvs+g*D+d]
						}
						p[j] = s * scale
						m = math.Max(m, p[j])
					}
				}
				sum := 0.0
				for j := range p {
					p[j] = math.Exp(p[j] - m)
					sum += p[j]
				}
				for j := range p { // dropout after the softmax's sum
					p[j] *= attnDropRef(&cfg, b, h, i, j)
				}
				oi := out[(b*T+i)*qs+h*D:][:D]
				for d := range oi {
					oi[d] = 0
					for j := 0; j < T; j++ {
						oi[d] += p[j] / sum * v[(b*T+j)*kvs+g*D+d]
					}
				}
				lse[(b*cfg.HQ+h)*T+i] = m + math.Log(sum)
			}
		}
	}
}

// attentionBackwardRef is the float64 reference for AttentionBackward using the
// textbook softmax gradient dS = P*(dP - Σ_j P dP) (not the D_i = dout·out
// shortcut the fast path uses), with dropout P̃ = P∘Z: dv += P̃ᵀ dout and
// dP = Z∘(dout vᵀ).
func attentionBackwardRef(dq, dk, dv, dout, q, k, v, lse []float64, cfg AttentionConfig) {
	T, D := cfg.T, cfg.D
	qs, kvs, grp := cfg.HQ*D, cfg.HKV*D, cfg.HQ/cfg.HKV
	scale := float64(cfg.scale())
	p, pd, dp := make([]float64, T), make([]float64, T), make([]float64, T)
	for b := 0; b < cfg.B; b++ {
		for h := 0; h < cfg.HQ; h++ {
			g := h / grp
			for i := 0; i < T; i++ {
				row := (b*T+i)*qs + h*D
				sumPdP := 0.0
				for j := 0; j < T; j++ {
					p[j], pd[j], dp[j] = 0, 0, 0
					if !attnAllowed(&cfg, b, i, j) {
						continue
					}
					kr := (b*T+j)*kvs + g*D
					s := 0.0
					for d := 0; d < D; d++ {
						s += q[row+d] * k[kr+d]
						dp[j] += dout[row+d] * v[kr+d]
					}
					z := attnDropRef(&cfg, b, h, i, j)
					dp[j] *= z
					p[j] = math.Exp(s*scale - lse[(b*cfg.HQ+h)*T+i])
					pd[j] = p[j] * z
					sumPdP += p[j] * dp[j]
				}
				for j := 0; j < T; j++ {
					if p[j] == 0 {
						continue
					}
					kr := (b*T+j)*kvs + g*D
					ds := p[j] * (dp[j] - sumPdP) * scale
					for d := 0; d < D; d++ {
						dv[kr+d] += pd[j] * dout[row+d]
						dq[row+d] += ds * k[kr+d]
						dk[kr+d] += ds * q[row+d]
					}
				}
			}
		}
	}
}
