package kernels_test

import (
	"math"
	"strconv"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestAttntcHostKernels runs attntc.cu's own kernels on the host
// (testdata/attntc_host.cc: host threads for CUDA threads, mma.sync
// emulated from the PTX ISA's fragment layouts) against the CPU backend's
// float32 attention: causal and full, GQA and MQA, dropout, documents,
// a two-block ring with Accumulate, head dimensions 64 and 128, T not a
// multiple of 64. The bounds are tensor.TestAttntcEmulation's (the same
// rounding, so the same worst errors up to float32 noise). This checks
// the kernels' tile, fragment and shared-memory indexing without a GPU;
// the PTX compiler and the tensor cores themselves only a GPU run checks.
func TestAttntcHostKernels(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: building and running the host harness takes a few seconds")
	}
	for _, c := range []struct {
		name              string
		B, T, HQ, HKV, D  int
		causal, docs      bool
		dropout           float32
		firstHead, blocks int
	}{
		{name: "gqa-causal-d64", B: 1, T: 80, HQ: 4, HKV: 2, D: 64, causal: true},
		{name: "mha-full-dropout-docs-d64", B: 1, T: 70, HQ: 2, HKV: 2, D: 64, dropout: 0.1, docs: true, firstHead: 3},
		{name: "mqa-causal-dropout-d128", B: 1, T: 90, HQ: 2, HKV: 1, D: 128, causal: true, dropout: 0.2},
		{name: "blocks-odd-kpos-causal-dropout-d64", B: 1, T: 65, HQ: 2, HKV: 1, D: 64, causal: true, dropout: 0.1, blocks: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rng := tensor.NewRNG(uint64(len(c.name)))
			fill := func(n int) []float32 {
				x := make([]float32, n)
				rng.Normal(x, 0, 1)
				return x
			}
			nq, nkv, nl := c.B*c.T*c.HQ*c.D, c.B*c.T*c.HKV*c.D, c.B*c.HQ*c.T
			blocks := max(c.blocks, 1)
			q, dout, dq0 := fill(nq), fill(nq), fill(nq)
			var ks, vs, dk0, dv0 [][]float32
			for range blocks {
				ks, vs, dk0, dv0 = append(ks, fill(nkv)), append(vs, fill(nkv)), append(dk0, fill(nkv)), append(dv0, fill(nkv))
			}
			var docs []int32
			if c.docs {
				docs = make([]int32, c.B*c.T)
				for i := range docs {
					docs[i] = int32(i % c.T / 30)
				}
			}
			cfgOf := func(bl int) tensor.AttentionConfig {
				cfg := tensor.AttentionConfig{B: c.B, T: c.T, HQ: c.HQ, HKV: c.HKV, D: c.D, Causal: c.causal,
					Dropout: c.dropout, DropoutSeed: 23, FirstHead: c.firstHead}
				if c.blocks > 0 {
					cfg.QPos, cfg.KPos, cfg.Accumulate = c.T, bl*c.T, bl > 0
				}
				return cfg
			}
			// the CPU backend
			cpuBe := tensor.CPUBackend()
			out, lse := tensor.New(tensor.Float32, c.B, c.T, c.HQ, c.D), tensor.New(tensor.Float32, c.B, c.HQ, c.T)
			qT, doT := tensor.FromFloat32(q, c.B, c.T, c.HQ, c.D), tensor.FromFloat32(dout, c.B, c.T, c.HQ, c.D)
			kv := func(x []float32) *tensor.Tensor {
				return tensor.FromFloat32(append([]float32(nil), x...), c.B, c.T, c.HKV, c.D)
			}
			withDocs := func(cfg tensor.AttentionConfig) tensor.AttentionConfig {
				if docs != nil {
					cfg.DocIDs = tensor.FromInt32(docs, c.B, c.T)
				}
				return cfg
			}
			for bl := range blocks {
				cpuBe.AttentionForward(out, lse, qT, kv(ks[bl]), kv(vs[bl]), withDocs(cfgOf(bl)))
			}
			dqT := tensor.FromFloat32(append([]float32(nil), dq0...), c.B, c.T, c.HQ, c.D)
			var wDk, wDv []float32
			for bl := range blocks {
				dkT, dvT := kv(dk0[bl]), kv(dv0[bl])
				cpuBe.AttentionBackward(dqT, dkT, dvT, doT, qT, kv(ks[bl]), kv(vs[bl]), out, lse, withDocs(cfgOf(bl)))
				wDk, wDv = append(wDk, dkT.Float32s()...), append(wDv, dvT.Float32s()...)
			}
			// the kernels on the host
			args := func(mode string, bl int) []any {
				cfg := cfgOf(bl)
				a := []any{mode, c.B, c.T, c.HQ, c.HKV, c.D, strconv.FormatFloat(1/math.Sqrt(float64(c.D)), 'g', -1, 32), b2i(c.causal),
					strconv.FormatFloat(float64(c.dropout), 'g', -1, 32), 23, c.firstHead, cfg.QPos, cfg.KPos}
				if mode == "fwd" {
					a = append(a, b2i(cfg.Accumulate))
				}
				return append(a, b2i(c.docs))
			}
			gOut, gLse := make([]float32, nq), make([]float32, nl)
			for bl := range blocks {
				res := runAttntcHost(t, args("fwd", bl), docs, q, ks[bl], vs[bl], gOut, gLse)
				gOut, gLse = res[:nq], res[nq:]
			}
			gDq := dq0
			var gDk, gDv []float32
			for bl := range blocks {
				res := runAttntcHost(t, args("bwd", bl), docs, q, ks[bl], vs[bl], dout, gOut, gLse, gDq, dk0[bl], dv0[bl])
				gDq = res[:nq]
				gDk, gDv = append(gDk, res[nq:nq+nkv]...), append(gDv, res[nq+nkv:]...)
			}
			for _, r := range []struct {
				what      string
				got, want []float32
				bound     float64
			}{
				{"out", gOut, out.Float32s(), 1.2e-2}, {"lse", gLse, lse.Float32s(), 6e-3},
				{"dq", gDq, dqT.Float32s(), 2.5e-2}, {"dk", gDk, wDk, 2.5e-2}, {"dv", gDv, wDv, 2.5e-2},
			} {
				worst, at := 0.0, -1
				for i, w := range r.want {
					g := r.got[i]
					if g == w {
						continue
					}
					e := math.Abs(float64(g)-float64(w)) / max(1, math.Abs(float64(w)))
					if !(e <= worst) {
						worst, at = e, i
					}
				}
				t.Logf("%s: worst error %.2e", r.what, worst)
				if !(worst <= r.bound) {
					t.Errorf("%s element %d: %v on the host-run kernels, the CPU gives %v: error %g above %g", r.what, at, r.got[at], r.want[at], worst, r.bound)
				}
			}
		})
	}
}

// runAttntcHost runs the harness with args, the float32 inputs and then
// docs on stdin, and returns what it wrote.
func runAttntcHost(t *testing.T, args []any, docs []int32, in ...[]float32) []float32 {
	t.Helper()
	var stdin []byte
	for _, x := range in {
		stdin = append(stdin, leBytes(x)...)
	}
	if docs != nil {
		stdin = append(stdin, leBytes(docs)...)
	}
	return fromLE[float32](attntcHost.run(t, stdin, args...))
}
