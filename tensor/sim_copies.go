package tensor

import (
	"sync"
	"unsafe"
)

// The CUDA backend's own host copies (not the explicit ones a caller asks
// for), by the name Transfers.Sites gives them; the simulated backend
// counts the same copies at the same moments, so that a run on --device
// sim shows what a GPU's steps copy.
const (
	// siteListTables: a tensor list's device tables (addresses, starts,
	// chunks: three copies), built on a list's first use and rebuilt when
	// a tensor's storage moved.
	siteListTables = "tensor list tables"
	// siteAdamWCoeffs, siteSGDCoeffs: the per-tensor coefficients of one
	// optimizer update.
	siteAdamWCoeffs = "AdamW coefficients"
	siteSGDCoeffs   = "SGD coefficients"
	// siteMaxAbs: the statistic MaxAbs reads back (SumSquares and
	// NonFinite leave theirs on the device, for ReadBack).
	siteMaxAbs = "MaxAbs read-back"
	// siteLossMaskDen, siteVocabCEDen: the loss's Σ mask, read back for
	// the backward's scale by the CUDA backend's LossMaskScale and
	// VocabCrossEntropyBackward unless GOTRON_CUDA_UNVERIFIED names
	// fewer-syncs (they read it on the device then, which the simulated
	// device counts as it is meant to be: no copy).
	siteLossMaskDen = "loss mask sum read-back"
	siteVocabCEDen  = "vocab-parallel loss mask sum read-back"
	// siteConstants: a constant's device copy (RoPE's tables), once.
	siteConstants = "device constants (RoPE tables)"
)

// simCountList counts l's device tables as the CUDA backend builds them:
// on first use, and again when a tensor's storage moved.
func simCountList(l *TensorList) {
	if l == nil {
		return
	}
	same := len(l.devPtrs) == len(l.ts)
	for i, t := range l.ts {
		if !same || l.devPtrs[i] != simAddr(t) {
			same = false
			break
		}
	}
	if same {
		return
	}
	l.devPtrs = make([]uintptr, len(l.ts))
	n := len(l.ts)
	chunks := 0
	for i, t := range l.ts {
		l.devPtrs[i] = simAddr(t)
		chunks += (t.Numel() + optimChunk - 1) / optimChunk
	}
	simTransfers.count(siteListTables, false, 8*int64(max(n, 1)))
	simTransfers.count(siteListTables, false, 8*int64(n+1))
	simTransfers.count(siteListTables, false, 24*int64(max(chunks, 1)))
}

// simAddr is the address of sim tensor t's element 0 (0 when it has none):
// what the CUDA backend's list tables hold.
func simAddr(t *Tensor) uintptr {
	if t.Numel() == 0 || len(t.f32) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&t.f32[t.offset]))
}

// simConsts are the constants the simulated device has "copied" (RoPE
// tables), once each as the CUDA backend's constant.
var simConsts sync.Map

func simCountConstant(key *Tensor) {
	if _, loaded := simConsts.LoadOrStore(key, true); !loaded {
		simTransfers.count(siteConstants, false, int64(key.Numel()*key.dtype.Size()))
	}
}

func (s simBackend) AdamW(params, grads, expAvg, expAvgSq *TensorList, coeffs []AdamWCoeffs) {
	if params.Numel() == 0 {
		return
	}
	for _, l := range []*TensorList{params, grads, expAvg, expAvgSq} {
		simCountList(l)
	}
	simTransfers.count(siteAdamWCoeffs, false, 36*int64(len(coeffs)))
	s.cpuBackend.AdamW(params, grads, expAvg, expAvgSq, coeffs)
}

func (s simBackend) SGD(params, grads, momentum *TensorList, coeffs []SGDCoeffs) {
	if params.Numel() == 0 {
		return
	}
	simCountList(params)
	simCountList(grads)
	simCountList(momentum)
	simTransfers.count(siteSGDCoeffs, false, 24*int64(len(coeffs)))
	s.cpuBackend.SGD(params, grads, momentum, coeffs)
}

func (s simBackend) ScaleList(l *TensorList, alpha float32) {
	if l.Numel() == 0 {
		return
	}
	simCountList(l)
	s.cpuBackend.ScaleList(l, alpha)
}

func (s simBackend) SumSquares(out *Tensor, l *TensorList) {
	if l.Numel() > 0 {
		simCountList(l)
	}
	s.cpuBackend.SumSquares(out, l)
}

func (s simBackend) MaxAbs(l *TensorList) float64 {
	if l.Numel() == 0 {
		return 0
	}
	simCountList(l)
	simTransfers.count(siteMaxAbs, true, 4)
	return s.cpuBackend.MaxAbs(l)
}

func (s simBackend) NonFinite(out *Tensor, l *TensorList) {
	if l.Numel() > 0 {
		simCountList(l)
	}
	s.cpuBackend.NonFinite(out, l)
}

func (s simBackend) RoPEForward(r *RoPE, out, x *Tensor, positions *Tensor) {
	s.countRoPE(r, x)
	s.cpuBackend.RoPEForward(r, out, x, positions)
}

func (s simBackend) RoPEBackward(r *RoPE, dx, dout *Tensor, positions *Tensor) {
	s.countRoPE(r, dout)
	s.cpuBackend.RoPEBackward(r, dx, dout, positions)
}

// countRoPE counts RoPE's tables the first time they are used, as the
// CUDA backend copies them (not for a call with nothing to rotate).
func (simBackend) countRoPE(r *RoPE, x *Tensor) {
	if x.Numel() == 0 {
		return
	}
	simCountConstant(r.cos)
	simCountConstant(r.sin)
}
