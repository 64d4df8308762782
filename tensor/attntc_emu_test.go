package tensor

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/internal/half"
)

// A host emulation of internal/cuda/kernels/attntc.cu (the tensor-core
// flash attention), written to be read beside the kernels: the same block
// sizes (64 queries, 64 keys, dk/dv query blocks of attntcDkvBQ), the same
// loop order, the same masks and dropout keys, and the same rounding —
// q, k, v, dout to bf16 on load, P·Z and dS to bf16 before their products,
// every product an m16n8k16 step (16 exact bf16 products summed, then
// added to the float32 accumulator), softmax statistics in float32 with
// the online rescaling per key block. What it cannot model is the tensor
// cores' internal accumulation order and expf's last bit; the GPU test's
// tolerance (cudaTolAttnTC in tensor/backendtest) is about twice the worst
// error this emulation shows against the CPU's float32 attention
// (TestAttntcEmulation).

// atcEmu is one call's inputs in the kernels' layouts. exact turns the bf16
// roundings off (everything float32): then the emulation must agree with
// the CPU within float32 rounding, which checks the schedule itself.
type atcEmu struct {
	cfg   AttentionConfig
	docs  []int32
	exact bool
}

func (e *atcEmu) bf(x float32) float32 {
	if e.exact {
		return x
	}
	return half.BFloat16From(x).Float32()
}

func (e *atcEmu) scale() float32 {
	if e.cfg.Scale != 0 {
		return e.cfg.Scale
	}
	return float32(1 / math.Sqrt(float64(e.cfg.D)))
}

// mma16 is one m16n8k16 product's contribution to one accumulator entry:
// acc + Σ_{u<16} a[u]·b[u], the 16 products (exact for bf16) summed exactly
// and rounded once.
func mma16(acc float32, a, b []float32) float32 {
	s := float64(acc)
	for u := range 16 {
		s += float64(a[u]) * float64(b[u])
	}
	return float32(s)
}

// dot is an accumulator entry over a whole k range (a multiple of 16) in
// k-steps of 16, as attntc_mma_tile runs them.
func dot(a, b []float32) float32 {
	var acc float32
	for k0 := 0; k0 < len(a); k0 += 16 {
		acc = mma16(acc, a[k0:k0+16], b[k0:k0+16])
	}
	return acc
}

// rounded returns x rounded to bf16 (the kernels' tile loads).
func (e *atcEmu) rounded(x []float32) []float32 {
	r := make([]float32, len(x))
	for i, v := range x {
		r[i] = e.bf(v)
	}
	return r
}

// row is the D values of (b, i, head hd) of a (B, T, heads, D) tensor.
func (e *atcEmu) row(x []float32, heads, b, i, hd int) []float32 {
	c := e.cfg
	return x[((b*c.T+i)*heads+hd)*c.D:][:c.D]
}

// col gathers column d of 16 rows i0.. of a (B, T, heads, D) tensor into
// buf, 0 past T (the zero-filled tile rows).
func (e *atcEmu) col(buf, x []float32, heads, b, i0, hd, d int) []float32 {
	for u := range 16 {
		buf[u] = 0
		if i := i0 + u; i < e.cfg.T {
			buf[u] = x[((b*e.cfg.T+i)*heads+hd)*e.cfg.D+d]
		}
	}
	return buf
}

// allowed is attntc_allowed for in-range i, j.
func (e *atcEmu) allowed(b, i, j int) bool {
	c := e.cfg
	if c.Causal && j > i+c.QPos-c.KPos {
		return false
	}
	return e.docs == nil || e.docs[b*c.T+i] == e.docs[b*c.T+j]
}

// keep is attntc_keep(attntc_row_key(...), j + kpos): the dropout
// multiplier of (b, local head h, query i, key j).
func (e *atcEmu) keep(b, h, i, j int) float32 {
	c := e.cfg
	if c.Dropout == 0 {
		return 1
	}
	const golden = 0x9E3779B97F4A7C15
	mix := func(z uint64) uint64 {
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		return z ^ z>>31
	}
	key := mix(c.DropoutSeed + uint64(b+1)*golden)
	key = mix(key + uint64(c.FirstHead+h+1)*golden)
	key = mix(key + uint64(i+c.QPos+1)*golden)
	jj := j + c.KPos
	x := mix(key + uint64(jj>>1)*golden)
	bits := uint32(x)
	if jj&1 == 1 {
		bits = uint32(x >> 32)
	}
	if bits >= uint32(float64(c.Dropout)*(1<<32)) {
		return float32(1 / (1 - float64(c.Dropout)))
	}
	return 0
}

func expf(x float32) float32 { return float32(math.Exp(float64(x))) }
func logf(x float32) float32 { return float32(math.Log(float64(x))) }

// forward is attntc_fwd: out and lse (B, HQ, T), merged into with Accumulate.
func (e *atcEmu) forward(out, lse, q, k, v []float32) {
	c := e.cfg
	sc, off := e.scale(), c.QPos-c.KPos
	q, k, v = e.rounded(q), e.rounded(k), e.rounded(v)
	pr, vcol := make([]float32, attntcBK), make([]float32, 16)
	for b := range c.B {
		for h := range c.HQ {
			kvh := h / (c.HQ / c.HKV)
			for i0 := 0; i0 < c.T; i0 += attntcBQ { // blockIdx.x
				jEnd := c.T
				if c.Causal {
					jEnd = max(0, min(c.T, i0+attntcBQ+off))
				}
				for i := i0; i < min(i0+attntcBQ, c.T); i++ { // a warp's row (rows are independent)
					m, l := float32(math.Inf(-1)), float32(0)
					o := make([]float32, c.D)
					for j0 := 0; j0 < jEnd; j0 += attntcBK {
						s := make([]float32, attntcBK)
						bmax := float32(math.Inf(-1))
						for jj := range attntcBK {
							j := j0 + jj
							if j >= c.T || !e.allowed(b, i, j) {
								s[jj] = float32(math.Inf(-1))
								continue
							}
							s[jj] = sc * dot(e.row(q, c.HQ, b, i, h), e.row(k, c.HKV, b, j, kvh))
							bmax = max(bmax, s[jj])
						}
						mNew := max(m, bmax)
						alpha := float32(1)
						if !math.IsInf(float64(mNew), -1) {
							alpha = expf(m - mNew)
						}
						// per lane t: keys 8nt+2t, 8nt+2t+1 in nt order, then the butterfly
						var part [4]float32
						for nt := range attntcBK / 8 {
							for t := range 4 {
								for u := range 2 {
									jj := 8*nt + 2*t + u
									p := float32(0)
									if !math.IsInf(float64(s[jj]), -1) {
										p = expf(s[jj] - mNew)
									}
									part[t] += p
									if p != 0 {
										p *= e.keep(b, h, i, j0+jj)
									}
									s[jj] = p
								}
							}
						}
						l = l*alpha + ((part[0] + part[1]) + (part[2] + part[3]))
						m = mNew
						for d := range c.D {
							o[d] *= alpha
						}
						for jj := range pr {
							pr[jj] = e.bf(s[jj])
						}
						for d := range c.D { // O += bf16(P·Z)·V, k-steps of 16 keys
							for k0 := 0; k0 < attntcBK; k0 += 16 {
								o[d] = mma16(o[d], pr[k0:k0+16], e.col(vcol, v, c.HKV, b, j0+k0, kvh, d))
							}
						}
					}
					lp := &lse[(b*c.HQ+h)*c.T+i]
					old := float32(math.Inf(-1))
					if c.Accumulate {
						old = *lp
					}
					lsNew, aOld, aNew := float32(math.Inf(-1)), float32(0), float32(0)
					if l != 0 {
						lsNew, aNew = m+logf(l), 1/l
					}
					ls := lsNew
					if !math.IsInf(float64(old), -1) {
						if math.IsInf(float64(lsNew), -1) {
							ls, aOld = old, 1
						} else {
							mx := max(old, lsNew)
							ls = mx + logf(expf(old-mx)+expf(lsNew-mx))
							aOld, aNew = expf(old-ls), expf(m-ls)
						}
					}
					ob := out[((b*c.T+i)*c.HQ+h)*c.D:][:c.D]
					for d := range c.D {
						x := o[d] * aNew
						if aOld != 0 {
							x += ob[d] * aOld
						}
						ob[d] = x
					}
					*lp = ls
				}
			}
		}
	}
}

// backward is attn_bwd_delta_f32, attntc_bwd_dq and attntc_bwd_dkv: adds
// into dq, dk, dv.
func (e *atcEmu) backward(dq, dk, dv, dout, q, k, v, out, lse []float32) {
	c := e.cfg
	sc, off := e.scale(), c.QPos-c.KPos
	delta := make([]float32, c.B*c.HQ*c.T) // float32, unrounded operands
	for b := range c.B {
		for i := range c.T {
			for h := range c.HQ {
				var s float32
				for d := range c.D {
					s += dout[((b*c.T+i)*c.HQ+h)*c.D+d] * out[((b*c.T+i)*c.HQ+h)*c.D+d]
				}
				delta[(b*c.HQ+h)*c.T+i] = s
			}
		}
	}
	q, k, v, dout = e.rounded(q), e.rounded(k), e.rounded(v), e.rounded(dout)
	// dS and P·Z of (b, h, i, j), both bf16-rounded, as both kernels
	// compute them (the same S and dP products in the same order): once
	// per (b, h) into T×T tables instead of once per kernel.
	var dsT, pzT []float32
	tables := func(b, h int) {
		kvh := h / (c.HQ / c.HKV)
		dsT, pzT = make([]float32, c.T*c.T), make([]float32, c.T*c.T)
		for i := range c.T {
			li := lse[(b*c.HQ+h)*c.T+i]
			for j := range c.T {
				if math.IsInf(float64(li), -1) || !e.allowed(b, i, j) {
					continue
				}
				s := dot(e.row(q, c.HQ, b, i, h), e.row(k, c.HKV, b, j, kvh))
				dp := dot(e.row(dout, c.HQ, b, i, h), e.row(v, c.HKV, b, j, kvh))
				p := expf(sc*s - li)
				z := e.keep(b, h, i, j)
				dsT[i*c.T+j], pzT[i*c.T+j] = e.bf(p*(z*dp-delta[(b*c.HQ+h)*c.T+i])*sc), e.bf(p*z)
			}
		}
	}
	// probs is (dS, P·Z) of (i, j) from the tables, 0 past T
	probs := func(i, j int) (ds, pz float32) {
		if i >= c.T || j >= c.T {
			return 0, 0
		}
		return dsT[i*c.T+j], pzT[i*c.T+j]
	}
	buf := make([]float32, 16)
	for b := range c.B {
		// attntc_bwd_dq: per query, key blocks of 64 in order
		for h := range c.HQ {
			kvh := h / (c.HQ / c.HKV)
			tables(b, h)
			for i0 := 0; i0 < c.T; i0 += attntcBQ {
				jEnd := c.T
				if c.Causal {
					jEnd = max(0, min(c.T, i0+attntcBQ+off))
				}
				for i := i0; i < min(i0+attntcBQ, c.T); i++ {
					acc := make([]float32, c.D)
					for j0 := 0; j0 < jEnd; j0 += attntcBK {
						ds := make([]float32, attntcBK)
						for jj := range ds {
							ds[jj], _ = probs(i, j0+jj)
						}
						for d := range c.D {
							for k0 := 0; k0 < attntcBK; k0 += 16 {
								acc[d] = mma16(acc[d], ds[k0:k0+16], e.col(buf, k, c.HKV, b, j0+k0, kvh, d))
							}
						}
					}
					for d := range c.D {
						dq[((b*c.T+i)*c.HQ+h)*c.D+d] += acc[d]
					}
				}
			}
		}
		// attntc_bwd_dkv: per key, the group's heads in order, query blocks of BQ in order
		bq := attntcDkvBQ(c.D)
		dsH, pzH := make([][]float32, c.HQ), make([][]float32, c.HQ)
		for h := range c.HQ {
			tables(b, h)
			dsH[h], pzH[h] = dsT, pzT
		}
		for kvh := range c.HKV {
			grp := c.HQ / c.HKV
			for j0 := 0; j0 < c.T; j0 += attntcBK {
				iStart := 0
				if c.Causal {
					iStart = max(0, j0-off) / bq * bq
				}
				for j := j0; j < min(j0+attntcBK, c.T); j++ {
					dkAcc, dvAcc := make([]float32, c.D), make([]float32, c.D)
					for h := kvh * grp; h < (kvh+1)*grp; h++ {
						dsT, pzT = dsH[h], pzH[h]
						for i0 := iStart; i0 < c.T; i0 += bq {
							ds, pz := make([]float32, bq), make([]float32, bq)
							for ii := range bq {
								ds[ii], pz[ii] = probs(i0+ii, j)
							}
							for d := range c.D {
								for k0 := 0; k0 < bq; k0 += 16 {
									dvAcc[d] = mma16(dvAcc[d], pz[k0:k0+16], e.col(buf, dout, c.HQ, b, i0+k0, h, d))
									dkAcc[d] = mma16(dkAcc[d], ds[k0:k0+16], e.col(buf, q, c.HQ, b, i0+k0, h, d))
								}
							}
						}
					}
					for d := range c.D {
						dk[((b*c.T+j)*c.HKV+kvh)*c.D+d] += dkAcc[d]
						dv[((b*c.T+j)*c.HKV+kvh)*c.D+d] += dvAcc[d]
					}
				}
			}
		}
	}
}

// atcCase is one comparison of the emulation with the CPU backend. A case
// with blocks runs block attention: the queries sit at positions
// [T, 2T) of a 2T sequence and attend to two key blocks, KPos 0 then KPos
// T with Accumulate (context parallelism's ring), the backward once per
// block with the merged out and lse.
type atcCase struct {
	name             string
	B, T, HQ, HKV, D int
	causal, docs     bool
	dropout          float32
	blocks           bool
	firstHead        int
}

var atcCases = []atcCase{
	{name: "gqa-causal-d64", B: 1, T: 150, HQ: 4, HKV: 2, D: 64, causal: true},
	{name: "mha-full-dropout-d64", B: 1, T: 100, HQ: 2, HKV: 2, D: 64, dropout: 0.1, firstHead: 3},
	{name: "mqa-causal-docs-dropout-d128", B: 1, T: 130, HQ: 3, HKV: 1, D: 128, causal: true, docs: true, dropout: 0.2},
	{name: "gqa-full-d128", B: 1, T: 70, HQ: 2, HKV: 1, D: 128},
	{name: "blocks-causal-dropout-d64", B: 1, T: 90, HQ: 2, HKV: 1, D: 64, causal: true, dropout: 0.1, blocks: true},
}

// atcErr is the worst of |got - want| / max(1, |want|) (backendtest's
// closeSlice measure); infinities must match.
func atcErr(got, want []float32) float64 {
	worst := 0.0
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if g == w {
			continue
		}
		if math.IsInf(w, 0) || math.IsInf(g, 0) || math.IsNaN(g) {
			return math.Inf(1)
		}
		worst = max(worst, math.Abs(g-w)/max(1, math.Abs(w)))
	}
	return worst
}

// runAtcCase runs the case on the CPU backend and on the emulation and
// returns the worst errors of out, lse, dq, dk, dv.
func runAtcCase(c atcCase, exact bool) (errs [5]float64) {
	rng := NewRNG(uint64(len(c.name)) + 7)
	fill := func(n int) []float32 {
		x := make([]float32, n)
		rng.Normal(x, 0, 1)
		return x
	}
	nq, nkv, nl := c.B*c.T*c.HQ*c.D, c.B*c.T*c.HKV*c.D, c.B*c.HQ*c.T
	nBlocks := 1
	if c.blocks {
		nBlocks = 2
	}
	q, dout := fill(nq), fill(nq)
	ks, vs := make([][]float32, nBlocks), make([][]float32, nBlocks)
	for bl := range nBlocks {
		ks[bl], vs[bl] = fill(nkv), fill(nkv)
	}
	var docs []int32
	if c.docs {
		docs = make([]int32, c.B*c.T)
		for i := range docs {
			docs[i] = int32(i % c.T / 40)
		}
	}
	cfgOf := func(bl int) AttentionConfig {
		cfg := AttentionConfig{B: c.B, T: c.T, HQ: c.HQ, HKV: c.HKV, D: c.D, Causal: c.causal, Dropout: c.dropout,
			DropoutSeed: 17, FirstHead: c.firstHead, Precision: MatmulBF16}
		if c.blocks {
			cfg.QPos, cfg.KPos, cfg.Accumulate = c.T, bl*c.T, bl > 0
		}
		return cfg
	}
	dq0, dk0, dv0 := fill(nq), fill(nkv), fill(nkv)
	// CPU backend
	cpuBe := CPUBackend()
	out, lse := New(Float32, c.B, c.T, c.HQ, c.D), New(Float32, c.B, c.HQ, c.T)
	qT, doT := FromFloat32(q, c.B, c.T, c.HQ, c.D), FromFloat32(dout, c.B, c.T, c.HQ, c.D)
	kvT := func(x []float32) *Tensor { return FromFloat32(x, c.B, c.T, c.HKV, c.D) }
	cp := func(x []float32) []float32 { return append([]float32(nil), x...) }
	withDocs := func(cfg AttentionConfig) AttentionConfig {
		if docs != nil {
			cfg.DocIDs = FromInt32(docs, c.B, c.T)
		}
		return cfg
	}
	for bl := range nBlocks {
		cpuBe.AttentionForward(out, lse, qT, kvT(ks[bl]), kvT(vs[bl]), withDocs(cfgOf(bl)))
	}
	dqT := FromFloat32(cp(dq0), c.B, c.T, c.HQ, c.D)
	var wDk, wDv []float32
	for bl := range nBlocks {
		dkT, dvT := kvT(cp(dk0)), kvT(cp(dv0))
		cpuBe.AttentionBackward(dqT, dkT, dvT, doT, qT, kvT(ks[bl]), kvT(vs[bl]), out, lse, withDocs(cfgOf(bl)))
		wDk, wDv = append(wDk, dkT.Float32s()...), append(wDv, dvT.Float32s()...)
	}
	// emulation
	gOut, gLse, gDq := make([]float32, nq), make([]float32, nl), cp(dq0)
	for bl := range nBlocks {
		e := &atcEmu{cfg: cfgOf(bl), docs: docs, exact: exact}
		e.forward(gOut, gLse, q, ks[bl], vs[bl])
	}
	var gDk, gDv []float32
	for bl := range nBlocks {
		e := &atcEmu{cfg: cfgOf(bl), docs: docs, exact: exact}
		dk, dv := cp(dk0), cp(dv0)
		e.backward(gDq, dk, dv, dout, q, ks[bl], vs[bl], gOut, gLse)
		gDk, gDv = append(gDk, dk...), append(gDv, dv...)
	}
	return [5]float64{atcErr(gOut, out.Float32s()), atcErr(gLse, lse.Float32s()), atcErr(gDq, dqT.Float32s()),
		atcErr(gDk, wDk), atcErr(gDv, wDv)}
}

// Bounds on the emulation's worst error against the CPU's float32
// attention, per output. The GPU test's tolerance (cudaTolAttnTC in
// tensor/backendtest, 5e-2) is at least twice each of them; the
// worst errors seen (fixed seeds) were out 9.4e-3, lse 4.2e-3, dq 1.4e-2,
// dk 2.0e-2, dv 2.4e-2.
const (
	atcEmuBoundOut   = 1.2e-2
	atcEmuBoundLse   = 6e-3
	atcEmuBoundGrads = 2.5e-2
	atcExactBound    = 1e-4 // bf16 roundings off: float32 rounding only
)

// TestAttntcEmulation runs the emulation against the CPU backend on
// causal, full, GQA, MQA, dropout, document and block cases at head
// dimensions 64 and 128 and T not a multiple of 64: exactly (no bf16
// rounding) it must agree within float32 rounding — the schedule, masks,
// dropout keys and block merging are the CPU's — and with the kernels'
// rounding within the bounds above, which set the GPU test's tolerance.
func TestAttntcEmulation(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the emulation takes a few seconds")
	}
	names := [5]string{"out", "lse", "dq", "dk", "dv"}
	bounds := [5]float64{atcEmuBoundOut, atcEmuBoundLse, atcEmuBoundGrads, atcEmuBoundGrads, atcEmuBoundGrads}
	for _, c := range atcCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			exact := runAtcCase(c, true)
			bf16 := runAtcCase(c, false)
			var line string
			for i, n := range names {
				line += fmt.Sprintf(" %s %.2e (exact %.1e)", n, bf16[i], exact[i])
				if !(exact[i] <= atcExactBound) {
					t.Errorf("%s without bf16 rounding: worst error %g against the CPU, want float32 rounding (<= %g): the schedule differs from the CPU's", n, exact[i], atcExactBound)
				}
				if !(bf16[i] <= bounds[i]) {
					t.Errorf("%s with bf16 rounding: worst error %g against the CPU, above the bound %g that sets the GPU test's tolerance", n, bf16[i], bounds[i])
				}
			}
			t.Logf("worst error against the CPU:%s", line)
		})
	}
}
