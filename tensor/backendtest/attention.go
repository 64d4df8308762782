package backendtest

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// attnCase is one AttentionForward/AttentionBackward shape and mask.
type attnCase struct {
	Name             string
	B, T, HQ, HKV, D int
	Causal, Docs     bool
	Dropout          float32
	Scale            float32
	FirstHead        int
	DropoutSeed      uint64
	docLen           int // tokens per document when Docs
}

// attnCases reach what the op cases' small attention does not: several
// query and key tiles with partial last tiles, head dimensions below and
// at a device kernel's limits (20, 64, 96, 128), grouped-query and
// multi-query attention, causal and full masks, document masks, dropout
// with a tensor-parallel first head, and an explicit scale.
var attnCases = []attnCase{
	{Name: "gqa-causal-d64", B: 2, T: 100, HQ: 4, HKV: 2, D: 64, Causal: true},
	{Name: "mqa-full-docs-dropout-d96", B: 1, T: 77, HQ: 3, HKV: 1, D: 96, Docs: true, docLen: 20, Dropout: 0.1, FirstHead: 2, DropoutSeed: 11, Scale: 0.3},
	{Name: "mha-causal-docs-dropout-d128", B: 1, T: 130, HQ: 2, HKV: 2, D: 128, Causal: true, Docs: true, docLen: 45, Dropout: 0.25, DropoutSeed: 5},
	{Name: "small-d20", B: 2, T: 33, HQ: 2, HKV: 1, D: 20, Causal: true},
}

// CheckAttention runs be.AttentionForward and be.AttentionBackward on
// attnCases and compares out, lse and the gradients (accumulated into
// non-zero dq, dk, dv) with the CPU backend's, within
// tol·max(1, |cpu|) per element (tol 0: bit for bit). A device backend
// states its tolerance beside its call, as for CheckOps.
func CheckAttention(be tensor.Backend, tol float64) error {
	return CheckAttentionPrecision(be, tensor.MatmulFP32, tol)
}

// CheckAttentionPrecision is CheckAttention with AttentionConfig.Precision
// set to prec on both backends: the CPU computes in float32 whatever it
// says, so for bf16 or fp16 tol states how far a backend's reduced
// products may be from float32.
func CheckAttentionPrecision(be tensor.Backend, prec tensor.MatmulPrecision, tol float64) error {
	return checkAttentionCases(be, prec, tol, attnCases)
}

// attntcCases are CheckAttentionTensorCores' shapes: the tensor-core
// kernels' head dimensions (64, 128), T not a multiple of their 64-row
// blocks, causal and full, GQA and MQA, dropout, documents.
var attntcCases = []attnCase{
	{Name: "gqa-causal-d64", B: 2, T: 150, HQ: 4, HKV: 2, D: 64, Causal: true},
	{Name: "mha-full-dropout-d64", B: 1, T: 100, HQ: 2, HKV: 2, D: 64, Dropout: 0.1, FirstHead: 3, DropoutSeed: 17},
	{Name: "mqa-causal-docs-dropout-d128", B: 1, T: 130, HQ: 3, HKV: 1, D: 128, Causal: true, Docs: true, docLen: 40, Dropout: 0.2, DropoutSeed: 5},
	{Name: "gqa-full-d128", B: 2, T: 70, HQ: 4, HKV: 1, D: 128, Scale: 0.1},
	{Name: "mha-causal-d64-long", B: 1, T: 300, HQ: 2, HKV: 2, D: 64, Causal: true},
}

// CheckAttentionTensorCores is CheckAttentionPrecision at bf16 on
// attntcCases, for the CUDA backend's tensor-core attention.
func CheckAttentionTensorCores(be tensor.Backend, tol float64) error {
	return checkAttentionCases(be, tensor.MatmulBF16, tol, attntcCases)
}

func checkAttentionCases(be tensor.Backend, prec tensor.MatmulPrecision, tol float64, cases []attnCase) error {
	cpuBe := tensor.CPUBackend()
	dev := be.Device()
	for ci, c := range cases {
		rng := tensor.NewRNG(uint64(ci) + 40)
		fill := func(n int) []float32 {
			x := make([]float32, n)
			rng.Normal(x, 0, 1)
			return x
		}
		nq, nkv, nl := c.B*c.T*c.HQ*c.D, c.B*c.T*c.HKV*c.D, c.B*c.HQ*c.T
		q, k, v, dout := fill(nq), fill(nkv), fill(nkv), fill(nq)
		dq0, dk0, dv0 := fill(nq), fill(nkv), fill(nkv)
		cfg := tensor.AttentionConfig{B: c.B, T: c.T, HQ: c.HQ, HKV: c.HKV, D: c.D, Scale: c.Scale, Causal: c.Causal,
			Dropout: c.Dropout, DropoutSeed: c.DropoutSeed, FirstHead: c.FirstHead, Precision: prec}
		var docs []int32
		if c.Docs {
			docs = make([]int32, c.B*c.T)
			for i := range docs {
				docs[i] = int32(i % c.T / c.docLen)
			}
		}
		// run computes forward and backward on one backend.
		run := func(be tensor.Backend, dev tensor.Device) (out, lse, dq, dk, dv []float32) {
			qT, kT, vT := onDev(dev, q, c.B, c.T, c.HQ, c.D), onDev(dev, k, c.B, c.T, c.HKV, c.D), onDev(dev, v, c.B, c.T, c.HKV, c.D)
			cfg := cfg
			if docs != nil {
				cfg.DocIDs = idsOn(dev, docs, c.B, c.T)
			}
			outT, lseT := tensor.ZerosOn(dev, c.B, c.T, c.HQ, c.D), tensor.ZerosOn(dev, c.B, c.HQ, c.T)
			be.AttentionForward(outT, lseT, qT, kT, vT, cfg)
			dqT := onDevCopy(dev, dq0, c.B, c.T, c.HQ, c.D)
			dkT, dvT := onDevCopy(dev, dk0, c.B, c.T, c.HKV, c.D), onDevCopy(dev, dv0, c.B, c.T, c.HKV, c.D)
			be.AttentionBackward(dqT, dkT, dvT, onDev(dev, dout, c.B, c.T, c.HQ, c.D), qT, kT, vT, outT, lseT, cfg)
			return host(outT), host(lseT), host(dqT), host(dkT), host(dvT)
		}
		gOut, gLse, gDq, gDk, gDv := run(be, dev)
		wOut, wLse, wDq, wDk, wDv := run(cpuBe, tensor.CPU)
		for _, r := range []struct {
			what      string
			got, want []float32
			n         int
		}{{"out", gOut, wOut, nq}, {"lse", gLse, wLse, nl}, {"dq", gDq, wDq, nq}, {"dk", gDk, wDk, nkv}, {"dv", gDv, wDv, nkv}} {
			if err := closeSlice(fmt.Sprintf("%s: attention %s", c.Name, r.what), r.got[:r.n], r.want[:r.n], tol); err != nil {
				return err
			}
		}
	}
	return nil
}

// closeSlice reports the first element of got not within tol·max(1, |want|)
// of want (bit for bit when tol is 0; equal infinities match).
func closeSlice(what string, got, want []float32, tol float64) error {
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) {
			continue
		}
		if tol == 0 {
			return fmt.Errorf("%s element %d: %v, want %v (bit for bit)", what, i, g, w)
		}
		if d := math.Abs(float64(g) - float64(w)); !(d <= tol*math.Max(1, math.Abs(float64(w)))) {
			return fmt.Errorf("%s element %d: %v, want %v within %g", what, i, g, w, tol)
		}
	}
	return nil
}
