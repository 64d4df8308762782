package tensor

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/cpu"
)

// The ops of DeepSeek sparse attention (DSA, model/gpt's dsa.go): the
// lightning indexer's Hadamard rotation, its top-k selection of keys, the
// attention restricted to them and the indexer's KL loss. They compute
// with internal/cpu's kernels on host memory (the CPU and the simulated
// device) and with dsa.cu's kernels and cuBLAS on the GPU
// (cuda_backend_dsa.go: built, not yet run on a GPU, so
// gpt.Config.CheckDevice refuses such a model on --device cuda unless
// GOTRON_CUDA_UNVERIFIED names dsa).

// Detach returns x as a tensor no recorded op differentiates (torch's
// .detach()): it shares x's storage, and ops on it record nothing unless
// another of their inputs requires a gradient.
func (tp *Tape) Detach(x *Tensor) *Tensor {
	return x.view(x.shape, x.strides, x.offset)
}

// Hadamard is Megatron's rotate_activation for the DSA indexer
// (fast_hadamard_transform's hadamard_transform(x, scale=d^-0.5)): each
// vector along x's last dimension d, a power of two, times the
// Sylvester-ordered ±1 Hadamard matrix over sqrt(d). The transform is
// orthonormal, so the indexer's query·key products are unchanged by it in
// exact arithmetic; it is applied as Megatron applies it.
func (tp *Tape) Hadamard(x *Tensor) *Tensor {
	d := x.Dim(-1)
	if d <= 0 || d&(d-1) != 0 {
		panic(fmt.Sprintf("tensor: Hadamard of %v: the last dimension must be a power of two", x.shape))
	}
	return tp.Apply(&hadamard{n: x.Numel() / d, d: d}, tp.Contiguous(x))[0]
}

type hadamard struct {
	n, d int
	x    *Tensor
}

func (f *hadamard) scale() float64 { return 1 / math.Sqrt(float64(f.d)) }

func (f *hadamard) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.x = in[0]
	out := tp.EmptyLike(in[0], in[0].shape...)
	if in[0].dev == CUDA {
		cudaHadamard(out, in[0], f.n, f.d, f.scale())
		return []*Tensor{out}
	}
	if hostOnly(tp, "Hadamard", in...) {
		cpu.HadamardTransform(out.f32s(), in[0].f32s(), f.n, f.d, f.scale())
	}
	return []*Tensor{out}
}

func (f *hadamard) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dx := tp.EmptyLike(f.x, f.x.shape...)
	if f.x.dev == CUDA {
		cudaHadamard(dx, g[0].Contiguous(), f.n, f.d, f.scale())
		return []*Tensor{dx}
	}
	if hostOnly(tp, "Hadamard", f.x) {
		cpu.HadamardTransform(dx.f32s(), g[0].Contiguous().f32s(), f.n, f.d, f.scale())
	}
	return []*Tensor{dx}
}

// DSASelection is the lightning indexer's choice of keys for one layer's
// micro-batch: Scores (b, t, t) are its causal index scores (−Inf above
// the diagonal) and Idx (b, t, K) each query's K selected key positions
// by decreasing score, −1 where a query has fewer than K keys. On the GPU
// both stay on the device (Scores and Idx nil).
type DSASelection struct {
	B, T, K int
	Scores  []float32
	Idx     []int32
	// scoresDev (b, t, t) and idxDev (b, t, K, int32): the selection on
	// the GPU (cuda_backend_dsa.go).
	scoresDev, idxDev *Tensor
}

// onDevice reports whether s lives on the GPU.
func (s *DSASelection) onDevice() bool { return s.idxDev != nil }

// DSAIndexerTopK scores every causal (query, key) pair with the indexer's
// queries q (b, t, H, D), keys k (b, t, D) and head weights w (b, t, H),
// ReLU on each head's product when relu, and selects each query's
// min(topk, t) best keys (dsa.py's fused_qk_topk_naive). Nothing is
// recorded: the selection is not differentiated.
func DSAIndexerTopK(q, k, w *Tensor, topk int, relu bool) (*DSASelection, error) {
	if q.NDim() != 4 || k.NDim() != 3 || w.NDim() != 3 || k.Dim(0) != q.Dim(0) || k.Dim(1) != q.Dim(1) || k.Dim(2) != q.Dim(3) ||
		w.Dim(0) != q.Dim(0) || w.Dim(1) != q.Dim(1) || w.Dim(2) != q.Dim(2) {
		return nil, fmt.Errorf("tensor: DSA indexer of q %v, k %v, weights %v: want (b, t, H, D), (b, t, D), (b, t, H)", q.shape, k.shape, w.shape)
	}
	if topk <= 0 {
		return nil, fmt.Errorf("tensor: DSA indexer top-k %d: want > 0", topk)
	}
	b, t, H, D := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	if allCUDA(q, k, w) {
		return cudaDSAIndexerTopK(q.Contiguous(), k.Contiguous(), w.Contiguous(), b, t, H, D, min(topk, t), relu), nil
	}
	for _, x := range []*Tensor{q, k, w} {
		if x.dev == CUDA {
			return nil, fmt.Errorf("tensor: DSA indexer of tensors on %v, %v and %v: want one device", q.dev, k.dev, w.dev)
		}
	}
	s := &DSASelection{B: b, T: t, K: min(topk, t), Scores: make([]float32, b*t*t)}
	s.Idx = make([]int32, b*t*s.K)
	cpu.IndexerScoresGEMM(s.Scores, q.Contiguous().f32s(), k.Contiguous().f32s(), w.Contiguous().f32s(), b, t, H, D, relu)
	cpu.IndexerTopK(s.Idx, s.Scores, b, t, s.K)
	return s, nil
}

// SparseAttention is attention of q over the keys sel selected for each
// query (dsa.py's sparse attention): q, k (b, t, n, dk), v (b, t, n, dv),
// the softmax of scale·q·k over each query's selected keys weighing their
// values; the output is (b, t, n, dv).
func (tp *Tape) SparseAttention(q, k, v *Tensor, sel *DSASelection, scale float32) *Tensor {
	if q.NDim() != 4 || !SameShape(q.shape, k.shape) || v.NDim() != 4 || v.Dim(0) != q.Dim(0) || v.Dim(1) != q.Dim(1) || v.Dim(2) != q.Dim(2) ||
		q.Dim(0) != sel.B || q.Dim(1) != sel.T {
		panic(fmt.Sprintf("tensor: SparseAttention of q %v, k %v, v %v over a selection of (%d, %d): want q and k (b, t, n, dk), v (b, t, n, dv)", q.shape, k.shape, v.shape, sel.B, sel.T))
	}
	f := &sparseAttention{sel: sel, n: q.Dim(2), dk: q.Dim(3), dv: v.Dim(3), scale: float64(scale)}
	return tp.Apply(f, tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(v))[0]
}

type sparseAttention struct {
	sel       *DSASelection
	n, dk, dv int
	scale     float64
	in        []*Tensor
	out, lse  *Tensor
}

func (f *sparseAttention) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.in = in
	s := f.sel
	f.out = tp.EmptyLike(in[0], s.B, s.T, f.n, f.dv)
	f.lse = tp.EmptyLike(in[0], s.B, s.T, f.n)
	if allCUDA(in...) && s.onDevice() {
		cudaSparseAttentionForward(f.out, f.lse, in[0], in[1], in[2], s, f.n, f.dk, f.dv, float32(f.scale))
		return []*Tensor{f.out}
	}
	if s.onDevice() {
		tp.Fail(fmt.Errorf("tensor: SparseAttention of host tensors over a selection on the GPU"))
		return []*Tensor{f.out}
	}
	if hostOnly(tp, "SparseAttention", in...) {
		cpu.SparseAttentionForward(f.out.f32s(), f.lse.f32s(), in[0].f32s(), in[1].f32s(), in[2].f32s(), s.Idx, s.B, s.T, f.n, f.dk, f.dv, s.K, f.scale)
	}
	return []*Tensor{f.out}
}

func (f *sparseAttention) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dq, dk, dv := zeroGrad(tp, f.in[0]), zeroGrad(tp, f.in[1]), zeroGrad(tp, f.in[2])
	if f.sel.onDevice() {
		if allCUDA(f.in...) {
			cudaSparseAttentionBackward(dq, dk, dv, g[0].Contiguous(), f.in[0], f.in[1], f.in[2], f.out, f.lse, f.sel, f.n, f.dk, f.dv, float32(f.scale))
		}
		return []*Tensor{dq, dk, dv}
	}
	if hostOnly(tp, "SparseAttention", f.in...) {
		s := f.sel
		cpu.SparseAttentionBackward(dq.f32s(), dk.f32s(), dv.f32s(), g[0].Contiguous().f32s(), f.in[0].f32s(), f.in[1].f32s(), f.in[2].f32s(),
			f.out.f32s(), f.lse.f32s(), s.Idx, s.B, s.T, f.n, f.dk, f.dv, s.K, f.scale)
	}
	return []*Tensor{dq, dk, dv}
}

// DSAIndexerTarget is the indexer loss's target before its tensor-parallel
// sum: the main attention's probabilities summed over the heads of q and k
// (b, t, n, dk; detached, as Megatron's query.detach() and key.detach()),
// each head's softmax of scale·q·k over the causal keys, or with sparse
// over the selected causal keys. The result (b, t, t) records nothing.
func DSAIndexerTarget(q, k *Tensor, sel *DSASelection, scale float32, sparse bool) (*Tensor, error) {
	if q.NDim() != 4 || !SameShape(q.shape, k.shape) || q.Dim(0) != sel.B || q.Dim(1) != sel.T {
		return nil, fmt.Errorf("tensor: DSA indexer target of q %v, k %v over a selection of (%d, %d)", q.shape, k.shape, sel.B, sel.T)
	}
	if q.dev == CUDA && k.dev == CUDA && sel.onDevice() {
		return cudaDSAIndexerTarget(q.Contiguous(), k.Contiguous(), sel, q.Dim(2), q.Dim(3), scale, sparse), nil
	}
	if q.dev == CUDA || k.dev == CUDA || sel.onDevice() {
		return nil, fmt.Errorf("tensor: DSA indexer target of q on %v, k on %v, a selection on the GPU: %v: want one device", q.dev, k.dev, sel.onDevice())
	}
	out := Zeros(sel.B, sel.T, sel.T).ToDevice(q.dev)
	cpu.IndexerTargetHeads(out.f32s(), q.Contiguous().f32s(), k.Contiguous().f32s(), sel.Idx, sel.B, sel.T, q.Dim(2), q.Dim(3), sel.K, float64(scale), sparse)
	return out, nil
}

// DSAIndexerLoss is the indexer's training loss as Megatron attaches it
// (DSAIndexerLossAutoScaler): AttachIndexerLoss returns out unchanged and
// the KL loss of the indexer's scores against target (the summed heads'
// probabilities over every tensor-parallel rank, normalised here), before
// Coeff; its backward passes out's gradient through and gives the
// indexer's queries q, keys k and weights w the loss's gradient times
// Coeff·GradScale (the loss receives GradScale as its gradient, Megatron's
// main_loss_backward_scale).
type DSAIndexerLoss struct {
	Coeff, GradScale float64
	ReLU, Sparse     bool
	// PerToken (--calculate-per-token-loss) sums the loss over the rows
	// instead of averaging it.
	PerToken bool
}

// AttachIndexerLoss attaches l's indexer loss to out (see DSAIndexerLoss);
// q (b, t, H, D), k (b, t, D) and w (b, t, H) are the indexer's inputs to
// sel's scores, target (b, t, t) DSAIndexerTarget's sum over every rank. It
// returns out's identity and the loss (times Coeff).
func (tp *Tape) AttachIndexerLoss(out, q, k, w, target *Tensor, sel *DSASelection, l DSAIndexerLoss) (*Tensor, float64) {
	if !SameShape(target.shape, []int{sel.B, sel.T, sel.T}) || q.NDim() != 4 || q.Dim(0) != sel.B || q.Dim(1) != sel.T {
		panic(fmt.Sprintf("tensor: AttachIndexerLoss of q %v, target %v over a selection of (%d, %d)", q.shape, target.shape, sel.B, sel.T))
	}
	f := &indexerLoss{l: l, sel: sel, target: target}
	outs := tp.Apply(f, tp.Contiguous(out), tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(w))
	return outs[0], f.loss * l.Coeff
}

type indexerLoss struct {
	l       DSAIndexerLoss
	sel     *DSASelection
	target  *Tensor
	in      []*Tensor
	dlogits []float32
	// dlogitsDev is dlogits on the GPU (a selection there)
	dlogitsDev *Tensor
	loss       float64
}

func (f *indexerLoss) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.in = in
	s := f.sel
	if s.onDevice() {
		if allCUDA(append([]*Tensor{f.target}, in...)...) {
			f.dlogitsDev = newCUDA(Float32, []int{s.B, s.T, s.T}, false)
			f.loss = cudaDSAIndexerLoss(f.dlogitsDev, f.target, s, f.l.Sparse, f.l.PerToken)
		} else {
			tp.Fail(fmt.Errorf("tensor: AttachIndexerLoss of host tensors over a selection on the GPU"))
		}
	} else if hostOnly(tp, "AttachIndexerLoss", append([]*Tensor{f.target}, in...)...) {
		f.dlogits = make([]float32, s.B*s.T*s.T)
		f.loss = cpu.IndexerLoss(f.dlogits, f.target.f32s(), s.Scores, s.Idx, s.B, s.T, s.K, f.l.Sparse, f.l.PerToken)
	}
	x := in[0]
	return []*Tensor{x.view(x.shape, x.strides, x.offset)}
}

func (f *indexerLoss) Backward(tp *Tape, g []*Tensor) []*Tensor {
	q, k, w := f.in[1], f.in[2], f.in[3]
	dq, dk, dw := zeroGrad(tp, q), zeroGrad(tp, k), zeroGrad(tp, w)
	if f.dlogitsDev != nil {
		be := cudaBackend{rt: cudaRT()}
		be.Scale(f.dlogitsDev, float32(f.l.Coeff*f.l.GradScale), f.dlogitsDev)
		s := f.sel
		cudaDSAIndexerBackward(dq, dk, dw, f.dlogitsDev, q, k, w, s.B, s.T, q.Dim(2), q.Dim(3), f.l.ReLU)
		f.dlogitsDev.dbuf.free()
		f.dlogitsDev = nil
	}
	if f.dlogits != nil && hostOnly(tp, "AttachIndexerLoss", f.in...) {
		a := float32(f.l.Coeff * f.l.GradScale)
		for i := range f.dlogits {
			f.dlogits[i] *= a
		}
		s := f.sel
		cpu.IndexerScoresBackwardGEMM(dq.f32s(), dk.f32s(), dw.f32s(), f.dlogits, q.f32s(), k.f32s(), w.f32s(), s.B, s.T, q.Dim(2), q.Dim(3), f.l.ReLU)
		f.dlogits = nil
	}
	return []*Tensor{g[0], dq, dk, dw}
}
