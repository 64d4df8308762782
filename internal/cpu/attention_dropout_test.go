package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnDropTileMatchesSpec: the tile-at-a-time masks are attnKeep's, for
// tiles of every width parity and at every tile offset.
func TestAttnDropTileMatchesSpec(t *testing.T) {
	cfg := AttentionConfig{B: 2, T: 200, HQ: 3, HKV: 1, D: 4, Dropout: 0.37, DropoutSeed: 99, FirstHead: 6}
	keep := make([]float32, attnBlockQ*attnBlockK)
	scale := float32(1 / (1 - float64(cfg.Dropout)))
	for b := range cfg.B {
		for h := range cfg.HQ {
			for i0 := 0; i0 < cfg.T; i0 += attnBlockQ {
				for j0 := 0; j0 < cfg.T; j0 += attnBlockK {
					nq, nk := min(attnBlockQ, cfg.T-i0), min(attnBlockK, cfg.T-j0) // nk = 8 at the end: even
					if j0 == 128 {
						nk = 61 // odd widths end with a lone key
					}
					attnDropTile(keep, &cfg, b, h, i0, nq, j0, nk)
					for r := range nq {
						for c := range nk {
							want := float32(0)
							if attnKeep(&cfg, b, h, i0+r, j0+c) {
								want = scale
							}
							if got := keep[r*attnBlockK+c]; got != want {
								t.Fatalf("b=%d h=%d i=%d j=%d: tile %g, spec %g", b, h, i0+r, j0+c, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestAttentionDropoutStatistics: the keyed masks keep a fraction 1-p of the
// probabilities, and neighbours in every key coordinate (the two halves of
// one hash, adjacent query rows, heads, batch rows, seeds) are dropped
// independently: both dropped with probability p². Bounds are 5 standard
// deviations of the binomial counts.
func TestAttentionDropoutStatistics(t *testing.T) {
	const B, H, T = 2, 4, 512
	for _, p := range []float32{0.1, 0.5} {
		cfg := AttentionConfig{B: B, T: T, HQ: H, HKV: 1, D: 1, Dropout: p, DropoutSeed: 7}
		other := cfg
		other.DropoutSeed = 8
		mask := func(c *AttentionConfig) []bool { // (B, H, T, T)
			m := make([]bool, B*H*T*T)
			keep := make([]float32, attnBlockQ*attnBlockK)
			for b := range B {
				for h := range H {
					for i0 := 0; i0 < T; i0 += attnBlockQ {
						for j0 := 0; j0 < T; j0 += attnBlockK {
							attnDropTile(keep, c, b, h, i0, attnBlockQ, j0, attnBlockK)
							for r := range attnBlockQ {
								for cc := range attnBlockK {
									m[((b*H+h)*T+i0+r)*T+j0+cc] = keep[r*attnBlockK+cc] == 0
								}
							}
						}
					}
				}
			}
			return m
		}
		drop, drop2 := mask(&cfg), mask(&other)
		check := func(what string, n, hits int, prob float64) {
			t.Helper()
			mean, sd := float64(n)*prob, math.Sqrt(float64(n)*prob*(1-prob))
			if math.Abs(float64(hits)-mean) > 5*sd {
				t.Errorf("p=%g %s: %d of %d, want %.0f ± %.0f", p, what, hits, n, mean, 5*sd)
			}
		}
		idx := func(b, h, i, j int) int { return ((b*H+h)*T+i)*T + j }
		var n, dropped, pair, row, head, batch, seed int
		for h := range H {
			for i := range T {
				for j := range T {
					d := drop[idx(0, h, i, j)]
					n++
					dropped += b2i(d) + b2i(drop[idx(1, h, i, j)])
					if j%2 == 0 {
						pair += b2i(d && drop[idx(0, h, i, j+1)])
					}
					if i+1 < T {
						row += b2i(d && drop[idx(0, h, i+1, j)])
					}
					if h+1 < H {
						head += b2i(d && drop[idx(0, h+1, i, j)])
					}
					batch += b2i(d && drop[idx(1, h, i, j)])
					seed += b2i(d && drop2[idx(0, h, i, j)])
				}
			}
		}
		pp := float64(p) * float64(p)
		check("dropped", 2*n, dropped, float64(p))
		check("both keys of one hash dropped", n/2, pair, pp)
		check("adjacent query rows dropped", n-H*T, row, pp)
		check("adjacent heads dropped", n-T*T, head, pp)
		check("batch rows 0 and 1 dropped", n, batch, pp)
		check("dropped under two seeds", n, seed, pp)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAttentionDropoutIsUnbiased: averaged over many seeds, the output with
// dropout is the output without it (inverted dropout scales kept
// probabilities by 1/(1-p)), within 5 standard errors.
func TestAttentionDropoutIsUnbiased(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cfg := AttentionConfig{B: 1, T: 8, HQ: 2, HKV: 1, D: 3, Causal: true}
	nq, nkv := cfg.B*cfg.T*cfg.HQ*cfg.D, cfg.B*cfg.T*cfg.HKV*cfg.D
	q, k, v := to32(randF64(rng, nq, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nkv, 1))
	want, lse := make([]float32, nq), make([]float32, cfg.B*cfg.HQ*cfg.T)
	AttentionForward(want, lse, q, k, v, cfg)
	const draws = 4000
	sum, sumSq := make([]float64, nq), make([]float64, nq)
	out := make([]float32, nq)
	cfg.Dropout = 0.3
	for s := range draws {
		cfg.DropoutSeed = uint64(s)
		AttentionForward(out, lse, q, k, v, cfg)
		for i, o := range out {
			sum[i] += float64(o)
			sumSq[i] += float64(o) * float64(o)
		}
	}
	for i := range sum {
		mean := sum[i] / draws
		se := math.Sqrt(max(sumSq[i]/draws-mean*mean, 0) / draws)
		if d := math.Abs(mean - float64(want[i])); d > 5*se+1e-6 {
			t.Errorf("out[%d]: mean over %d seeds %.5f, without dropout %.5f (standard error %.5f)", i, draws, mean, want[i], se)
		}
	}
}

// TestAttentionDropoutIndependentOfHeadSplit: the masks are keyed by global
// head, so splitting the heads over tensor-parallel ranks (each rank its
// contiguous query groups, FirstHead its first global head) gives every
// rank bitwise the outputs and gradients of its heads in the unsplit call.
func TestAttentionDropoutIndependentOfHeadSplit(t *testing.T) {
	defer SetThreads(SetThreads(1)) // the same backward schedule for every split
	rng := rand.New(rand.NewPCG(8, 9))
	full := AttentionConfig{B: 2, T: 70, HQ: 8, HKV: 4, D: 4, Causal: true, Dropout: 0.2, DropoutSeed: 31}
	nq, nkv := full.B*full.T*full.HQ*full.D, full.B*full.T*full.HKV*full.D
	q, k, v, g := to32(randF64(rng, nq, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nq, 1))
	run := func(cfg AttentionConfig, q, k, v, g []float32) (out, dq, dk, dv []float32) {
		out, lse := make([]float32, len(q)), make([]float32, cfg.B*cfg.HQ*cfg.T)
		AttentionForward(out, lse, q, k, v, cfg)
		dq, dk, dv = make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
		AttentionBackward(dq, dk, dv, g, q, k, v, out, lse, cfg)
		return out, dq, dk, dv
	}
	wantOut, wantDq, wantDk, wantDv := run(full, q, k, v, g)
	for _, size := range []int{2, 4} {
		for rank := range size {
			c := full
			c.HQ, c.HKV, c.FirstHead = full.HQ/size, full.HKV/size, rank*full.HQ/size
			// heads [h0, h0+n) of x (B, T, H, D)
			slice := func(x []float32, h, h0, n int) []float32 {
				var out []float32
				for r := 0; r < full.B*full.T; r++ {
					out = append(out, x[(r*h+h0)*full.D:(r*h+h0+n)*full.D]...)
				}
				return out
			}
			sq := func(x []float32) []float32 { return slice(x, full.HQ, c.FirstHead, c.HQ) }
			skv := func(x []float32) []float32 { return slice(x, full.HKV, rank*c.HKV, c.HKV) }
			out, dq, dk, dv := run(c, sq(q), skv(k), skv(v), sq(g))
			for _, cmp := range []struct {
				name      string
				got, want []float32
			}{{"out", out, sq(wantOut)}, {"dq", dq, sq(wantDq)}, {"dk", dk, skv(wantDk)}, {"dv", dv, skv(wantDv)}} {
				for i := range cmp.want {
					if cmp.got[i] != cmp.want[i] {
						t.Fatalf("%d ranks, rank %d: %s[%d] = %g, unsplit %g", size, rank, cmp.name, i, cmp.got[i], cmp.want[i])
					}
				}
			}
		}
	}
}

// BenchmarkAttentionDropout is BenchmarkAttention's GPT-2 head shape with
// Megatron's default attention dropout, for the cost of the keyed masks.
func BenchmarkAttentionDropout(b *testing.B) {
	for _, p := range []float32{0, 0.1} {
		cfg := AttentionConfig{B: 1, T: 1024, HQ: 12, HKV: 12, D: 64, Causal: true, Dropout: p, DropoutSeed: 1}
		b.Run(fmt.Sprintf("T1024-H12-D64-p%g", p), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			n := cfg.B * cfg.T * cfg.HQ * cfg.D
			q, k, v, dout := to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1))
			out, lse := make([]float32, n), make([]float32, cfg.B*cfg.HQ*cfg.T)
			dq, dk, dv := make([]float32, n), make([]float32, n), make([]float32, n)
			b.ResetTimer()
			for range b.N {
				AttentionForward(out, lse, q, k, v, cfg)
				AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
			}
			fwd, bwd := AttentionFLOPs(cfg)
			b.ReportMetric((fwd+bwd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// allowedDrops counts the allowed (unmasked) probabilities of cfg that its
// dropout keeps and drops: a test of the dropout path needs both.
func allowedDrops(cfg AttentionConfig) (kept, dropped int) {
	for b := range cfg.B {
		for h := range cfg.HQ {
			for i := range cfg.T {
				for j := range cfg.T {
					switch {
					case !attnAllowed(&cfg, b, i, j):
					case attnKeep(&cfg, b, h, i, j):
						kept++
					default:
						dropped++
					}
				}
			}
		}
	}
	return kept, dropped
}
