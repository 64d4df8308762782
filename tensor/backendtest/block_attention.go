package backendtest

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// blockAttnCase is one block attention (context parallelism) shape: one
// block of T queries at sequence position QPos attends to len(KPos) blocks
// of T keys at positions KPos, merged one after the other (the first call
// overwrites out and lse, the others set Accumulate), as parallel/cp's ring
// does; the backward runs once per key block into the same dq.
type blockAttnCase struct {
	Name             string
	B, T, HQ, HKV, D int
	QPos             int
	KPos             []int
	Causal           bool
	Dropout          float32
	DropoutSeed      uint64
	FirstHead        int
}

// blockAttnCases: the ring's orders (the diagonal block first, then earlier
// blocks; a block entirely after the queries, all masked, first, so the
// merge starts from lse -Inf), grouped-query heads, dropout keyed by
// position with a tensor-parallel first head, and a non-causal pair.
var blockAttnCases = []blockAttnCase{
	{Name: "causal-diagonal-then-earlier", B: 2, T: 40, HQ: 4, HKV: 2, D: 32, QPos: 80, KPos: []int{80, 0, 40}, Causal: true},
	{Name: "causal-masked-block-first-dropout", B: 1, T: 33, HQ: 3, HKV: 1, D: 64, QPos: 33, KPos: []int{66, 33, 0},
		Causal: true, Dropout: 0.2, DropoutSeed: 9, FirstHead: 3},
	{Name: "full-two-blocks", B: 2, T: 24, HQ: 2, HKV: 2, D: 20, QPos: 24, KPos: []int{24, 0}},
}

// CheckBlockAttention runs blockAttnCases through be.AttentionForward and
// be.AttentionBackward with QPos, KPos and Accumulate and compares out,
// lse, dq and every block's dk and dv with the CPU backend's, within
// tol·max(1, |cpu|) per element (tol 0: bit for bit).
func CheckBlockAttention(be tensor.Backend, tol float64) error {
	return checkBlockAttentionCases(be, tensor.MatmulFP32, tol, blockAttnCases)
}

// attntcBlockCases are block attention shapes at the tensor-core kernels'
// head dimensions (CheckBlockAttentionTensorCores).
var attntcBlockCases = []blockAttnCase{
	{Name: "causal-diagonal-then-earlier-d64", B: 1, T: 70, HQ: 4, HKV: 2, D: 64, QPos: 140, KPos: []int{140, 0, 70}, Causal: true},
	{Name: "causal-masked-block-first-dropout-d128", B: 1, T: 65, HQ: 2, HKV: 1, D: 128, QPos: 65, KPos: []int{130, 65, 0},
		Causal: true, Dropout: 0.2, DropoutSeed: 9, FirstHead: 3},
}

// CheckBlockAttentionTensorCores is CheckBlockAttention at bf16 on
// attntcBlockCases, for the CUDA backend's tensor-core attention.
func CheckBlockAttentionTensorCores(be tensor.Backend, tol float64) error {
	return checkBlockAttentionCases(be, tensor.MatmulBF16, tol, attntcBlockCases)
}

func checkBlockAttentionCases(be tensor.Backend, prec tensor.MatmulPrecision, tol float64, cases []blockAttnCase) error {
	cpuBe := tensor.CPUBackend()
	dev := be.Device()
	for ci, c := range cases {
		rng := tensor.NewRNG(uint64(ci) + 70)
		fill := func(n int) []float32 {
			x := make([]float32, n)
			rng.Normal(x, 0, 1)
			return x
		}
		nq, nkv, nl := c.B*c.T*c.HQ*c.D, c.B*c.T*c.HKV*c.D, c.B*c.HQ*c.T
		q, dout, dq0 := fill(nq), fill(nq), fill(nq)
		var k, v, dk0, dv0 [][]float32
		for range c.KPos {
			k, v, dk0, dv0 = append(k, fill(nkv)), append(v, fill(nkv)), append(dk0, fill(nkv)), append(dv0, fill(nkv))
		}
		cfgAt := func(blk int) tensor.AttentionConfig {
			return tensor.AttentionConfig{B: c.B, T: c.T, HQ: c.HQ, HKV: c.HKV, D: c.D, Causal: c.Causal,
				Dropout: c.Dropout, DropoutSeed: c.DropoutSeed, FirstHead: c.FirstHead,
				QPos: c.QPos, KPos: c.KPos[blk], Accumulate: blk > 0, Precision: prec}
		}
		// run returns out, lse, dq, then dk and dv of each block.
		run := func(be tensor.Backend, dev tensor.Device) [][]float32 {
			qT := onDev(dev, q, c.B, c.T, c.HQ, c.D)
			outT, lseT := tensor.ZerosOn(dev, c.B, c.T, c.HQ, c.D), tensor.ZerosOn(dev, c.B, c.HQ, c.T)
			var kT, vT []*tensor.Tensor
			for blk := range c.KPos {
				kT = append(kT, onDev(dev, k[blk], c.B, c.T, c.HKV, c.D))
				vT = append(vT, onDev(dev, v[blk], c.B, c.T, c.HKV, c.D))
				be.AttentionForward(outT, lseT, qT, kT[blk], vT[blk], cfgAt(blk))
			}
			dqT, doT := onDevCopy(dev, dq0, c.B, c.T, c.HQ, c.D), onDev(dev, dout, c.B, c.T, c.HQ, c.D)
			res := [][]float32{host(outT), host(lseT), nil}
			for blk := range c.KPos {
				dkT, dvT := onDevCopy(dev, dk0[blk], c.B, c.T, c.HKV, c.D), onDevCopy(dev, dv0[blk], c.B, c.T, c.HKV, c.D)
				cfg := cfgAt(blk)
				cfg.Accumulate = false // the backward reads the merged out and lse
				be.AttentionBackward(dqT, dkT, dvT, doT, qT, kT[blk], vT[blk], outT, lseT, cfg)
				res = append(res, host(dkT), host(dvT))
			}
			res[2] = host(dqT)
			return res
		}
		got, want := run(be, dev), run(cpuBe, tensor.CPU)
		for i := range want {
			what, n := "", nkv
			switch i {
			case 0:
				what, n = "out", nq
			case 1:
				what, n = "lse", nl
			case 2:
				what, n = "dq", nq
			default:
				what = fmt.Sprintf("%s of key block %d (KPos %d)", [2]string{"dk", "dv"}[(i-3)%2], (i-3)/2, c.KPos[(i-3)/2])
			}
			if err := closeSlice(fmt.Sprintf("%s: block attention %s", c.Name, what), got[i][:n], want[i][:n], tol); err != nil {
				return err
			}
		}
	}
	return nil
}
