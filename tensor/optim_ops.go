package tensor

import (
	"fmt"
	"math"
	"sort"
)

// Multi-tensor ops: the optimizer updates and gradient statistics work on
// whole lists of tensors, as Apex's multi_tensor_apply does on a GPU, so a
// backend can split the work over every parameter at once (the CPU backend
// splits the concatenated index space over its threads, so chunking does not
// depend on how a model is cut into tensors; a GPU backend would launch one
// kernel over a table of chunks). They update tensors in place and return
// statistics as host scalars: a small, explicit readback.

// TensorList is a fixed list of contiguous float32 tensors, seen as one flat
// index space [0, Numel()) in list order. Build one per list at set-up: a
// backend keeps per-list state in it (the CPU its work functions and partial
// sums), so the ops allocate nothing after their first call on a list. A
// TensorList is not safe for concurrent use, and its tensors must keep their
// storage while it is in use.
type TensorList struct {
	ts    []*Tensor
	start []int // start[i] is ts[i]'s first flat index; start[len(ts)] = Numel()
	cache any   // the backend's per-list state (cpuList for the CPU)
	// devPtrs are the addresses the simulated device counted device tables
	// for (sim_copies.go: it counts the copies the CUDA backend makes).
	devPtrs []uintptr
	// res64 and res32 hold SumSquares's and NonFinite's results (result).
	res64, res32 *Tensor
}

// NewTensorList returns the list of ts (the slice is copied, the tensors
// are not). It errors, naming the tensor, on a nil, non-float32 or
// non-contiguous one.
func NewTensorList(ts ...*Tensor) (*TensorList, error) {
	l := &TensorList{ts: append([]*Tensor(nil), ts...), start: make([]int, 0, len(ts)+1)}
	total := 0
	for i, t := range ts {
		switch {
		case t == nil:
			return nil, fmt.Errorf("tensor: tensor list: element %d is nil", i)
		case t.dtype != Float32:
			return nil, fmt.Errorf("tensor: tensor list: element %d (%q) is %v, want float32", i, t.Name, t.dtype)
		case !t.IsContiguous():
			return nil, fmt.Errorf("tensor: tensor list: element %d (%q) is a non-contiguous view", i, t.Name)
		case t.dev != ts[0].dev:
			return nil, fmt.Errorf("tensor: tensor list: element %d (%q) is on the %v device, element 0 (%q) on %v", i, t.Name, t.dev, ts[0].Name, ts[0].dev)
		}
		l.start = append(l.start, total)
		total += t.Numel()
	}
	l.start = append(l.start, total)
	return l, nil
}

// Len returns the number of tensors.
func (l *TensorList) Len() int { return len(l.ts) }

// At returns tensor i.
func (l *TensorList) At(i int) *Tensor { return l.ts[i] }

// Numel returns the total number of elements.
func (l *TensorList) Numel() int { return l.start[len(l.ts)] }

// each calls fn(i, a, b) for every tensor i overlapping the flat range
// [lo, hi), with [a, b) the overlap in that tensor's own indices.
func (l *TensorList) each(lo, hi int, fn func(i, a, b int)) {
	if lo >= hi {
		return
	}
	// First tensor whose end is > lo.
	i := sort.Search(len(l.ts), func(k int) bool { return l.start[k+1] > lo })
	for ; i < len(l.ts) && l.start[i] < hi; i++ {
		a := max(lo, l.start[i]) - l.start[i]
		b := min(hi, l.start[i+1]) - l.start[i]
		if a < b {
			fn(i, a, b)
		}
	}
}

// backendForList returns the backend owning l's storage (that of its first
// tensor; the CPU's for an empty list).
func backendForList(l *TensorList) Backend {
	if len(l.ts) == 0 {
		return backendFor(nil)
	}
	return backendFor(l.ts[0])
}

// mustMatch panics unless every list in others has l's length and, at each
// index, a tensor of the same size (a programming error, like a shape
// mismatch in an op). Nil lists are skipped.
func mustMatch(op string, l *TensorList, others ...*TensorList) {
	for k, o := range others {
		if o == nil {
			continue
		}
		if len(o.ts) != len(l.ts) {
			panic(fmt.Sprintf("tensor: %s: list %d has %d tensors, want %d", op, k+1, len(o.ts), len(l.ts)))
		}
		if len(o.ts) > 0 {
			sameDevice(op, l.ts[0], o.ts[0])
		}
		for i := range o.ts {
			if o.start[i+1] != l.start[i+1] {
				panic(fmt.Sprintf("tensor: %s: list %d: tensor %d (%q) has %d elements, want %d as %q",
					op, k+1, i, o.ts[i].Name, o.ts[i].Numel(), l.ts[i].Numel(), l.ts[i].Name))
			}
		}
	}
}

// AdamWCoeffs are the float32 scalars of one AdamW update of one tensor, as
// Apex's FusedAdam (adam_w_mode) takes them. OneMinusBeta1/2 are 1−β rounded
// to float32 (the CUDA kernel subtracts in float32); BC1/BC2 are the bias
// corrections 1−βᵗ.
type AdamWCoeffs struct {
	Beta1, Beta2                 float32
	OneMinusBeta1, OneMinusBeta2 float32
	Eps                          float32
	BC1, BC2                     float32
	LR, WD                       float32
}

// AdamW applies one AdamW step to every tensor i of params, with gradient
// grads[i], moments expAvg[i] and expAvgSq[i] and scalars coeffs[i]:
//
//	m ← β1·m + (1−β1)·g
//	v ← β2·v + ((1−β2)·g)·g
//	p ← p − lr·((m/bc1)/(√(v/bc2) + eps) + wd·p)
//
// with every product, quotient and sum rounded to float32 in this order and
// no fused multiply-add, so every backend gives the same bits. The lists must
// match tensor by tensor; it panics otherwise.
func AdamW(params, grads, expAvg, expAvgSq *TensorList, coeffs []AdamWCoeffs) {
	if grads == nil || expAvg == nil || expAvgSq == nil {
		panic("tensor: AdamW: nil list")
	}
	mustMatch("AdamW", params, grads, expAvg, expAvgSq)
	if len(coeffs) != params.Len() {
		panic(fmt.Sprintf("tensor: AdamW: %d coefficient sets for %d tensors", len(coeffs), params.Len()))
	}
	backendForList(params).AdamW(params, grads, expAvg, expAvgSq, coeffs)
}

// SGDCoeffs are the float32 scalars of one SGD update of one tensor
// (torch.optim.SGD and Apex FusedSGD semantics).
type SGDCoeffs struct {
	// LR is the learning rate; WD the coupled (L2) weight decay.
	LR, WD float32
	// Momentum multiplies the buffer; OneMinusDampening the gradient added
	// to it. Both are unused without a momentum buffer.
	Momentum, OneMinusDampening float32
	// FirstStep sets the buffer to the gradient instead of updating it.
	FirstStep bool
	// Nesterov steps along g + momentum·buf instead of buf.
	Nesterov bool
}

// SGD applies one SGD step to every tensor i of params with gradient
// grads[i], momentum buffer momentum[i] (momentum may be nil: no buffer) and
// scalars coeffs[i], in float32 with each product rounded (no FMA):
//
//	d = g + wd·p
//	buf = d on the first step, else momentum·buf + (1−dampening)·d
//	d = buf, or d + momentum·buf with Nesterov
//	p ← p − lr·d
//
// The lists must match tensor by tensor; it panics otherwise.
func SGD(params, grads, momentum *TensorList, coeffs []SGDCoeffs) {
	if grads == nil {
		panic("tensor: SGD: nil gradient list")
	}
	mustMatch("SGD", params, grads, momentum)
	if len(coeffs) != params.Len() {
		panic(fmt.Sprintf("tensor: SGD: %d coefficient sets for %d tensors", len(coeffs), params.Len()))
	}
	backendForList(params).SGD(params, grads, momentum, coeffs)
}

// ScaleList multiplies every element of l by alpha in place (Apex's
// multi_tensor_scale; gradient clipping and loss unscaling).
func ScaleList(l *TensorList, alpha float32) { backendForList(l).ScaleList(l, alpha) }

// NormBlock is the block size, in elements of a list's flat index space, of
// the partial results behind SumSquares and MaxAbs: every backend sums each
// block on its own (in float64, four interleaved accumulators per tensor
// piece) and then the blocks in order, so the result is the same bits for
// any thread count or backend.
const NormBlock = 1 << 13

// SumSquares returns Σ x² over every element of l, each square exact in
// float64 and summed in float64 in the fixed order NormBlock describes
// (SumSquaresTo, read back: one copy off the CPU).
func SumSquares(l *TensorList) float64 {
	out := l.result(Int64)
	SumSquaresTo(out, l)
	return Float64Bits(ToHost(out))
}

// SumSquaresTo writes SumSquares(l)'s float64 bits into out, an Int64 (1)
// tensor on l's device, without reading it back (Float64Bits reads a host
// copy): a step reads its statistics back together (ReadBack).
func SumSquaresTo(out *Tensor, l *TensorList) {
	mustScalarOut("SumSquaresTo", out, Int64, l)
	if len(l.ts) == 0 {
		backendFor(out).Fill(out, 0) // +0's bits
		return
	}
	backendForList(l).SumSquares(out, l)
}

// Float64Bits returns the float64 whose bits the host-readable Int64
// tensor t holds at element 0 (SumSquaresTo's result, read back).
func Float64Bits(t *Tensor) float64 {
	t.mustHost("Float64Bits")
	if t.dtype != Int64 || t.Numel() < 1 {
		panic(fmt.Sprintf("tensor: Float64Bits of %v, want an Int64 tensor", t))
	}
	return math.Float64frombits(uint64(t.i64[t.offset]))
}

// result returns l's one-element result tensor of dtype (Int64 or Int32)
// on l's device, made on first use, so that SumSquares and NonFinite
// allocate nothing on the CPU.
func (l *TensorList) result(dtype DType) *Tensor {
	p := &l.res32
	if dtype == Int64 {
		p = &l.res64
	}
	if *p == nil {
		*p = NewOn(listDevice(l), dtype, 1)
	}
	return *p
}

// listDevice is the device of l's tensors (the CPU for an empty list).
func listDevice(l *TensorList) Device {
	if len(l.ts) == 0 {
		return CPU
	}
	return l.ts[0].dev
}

// mustScalarOut panics unless out is a one-element tensor of dtype on
// l's device (an empty list's result may be anywhere).
func mustScalarOut(op string, out *Tensor, dtype DType, l *TensorList) {
	switch {
	case out == nil || out.dtype != dtype || out.Numel() != 1 || !out.IsContiguous():
		panic(fmt.Sprintf("tensor: %s: result %v, want a one-element %v tensor", op, out, dtype))
	case len(l.ts) > 0 && out.dev != l.ts[0].dev:
		panic(fmt.Sprintf("tensor: %s: result on the %v device, the list on %v", op, out.dev, l.ts[0].dev))
	}
}

// MaxAbs returns max |x| over every element of l (0 for an empty list), NaN
// if any element is NaN.
func MaxAbs(l *TensorList) float64 { return backendForList(l).MaxAbs(l) }

// NonFinite reports whether any element of l is NaN or ±Inf (NonFiniteTo,
// read back: one copy off the CPU).
func NonFinite(l *TensorList) bool {
	out := l.result(Int32)
	NonFiniteTo(out, l)
	return ToHost(out).Int32s()[0] != 0
}

// NonFiniteTo writes 1 into out, an Int32 (1) tensor on l's device, when
// an element of l is NaN or ±Inf, else 0, without reading it back.
func NonFiniteTo(out *Tensor, l *TensorList) {
	mustScalarOut("NonFiniteTo", out, Int32, l)
	if len(l.ts) == 0 {
		backendFor(out).Fill(out, 0)
		return
	}
	backendForList(l).NonFinite(out, l)
}
