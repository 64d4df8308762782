package tensor

import (
	"fmt"
	"math"
	"runtime"
)

// The CUDA backend's multi-tensor ops: internal/cuda/kernels' optim.cu.
// One launch covers a whole list (Apex's multi_tensor_apply): the kernels
// read a device table of the list's tensor addresses and a table of chunks
// (tensor, offset, length; at most optimChunk elements, none crossing a
// tensor), both built once per list and kept in its cache (rebuilt only if
// a tensor's address changes). The per-tensor coefficients go up with each
// call (a few bytes per tensor). The updates round as the CPU's, so AdamW,
// SGD and ScaleList are the CPU's bit for bit; SumSquares sums each
// NormBlock in tensor.NormBlock's order (bit for bit too), and MaxAbs and
// NonFinite do not depend on order. The statistics come back as one small
// readback.

// optimChunk is the most elements one block of an element kernel takes
// at a time.
const optimChunk = 1 << 14

// optimBlocks caps the blocks of a list kernel (chunks loop over them).
const optimBlocks = 65535

// cudaList is the CUDA backend's state for one TensorList.
type cudaList struct {
	ptrs    []uintptr // the tensors' device addresses the tables were built for
	ptrDev  *Tensor   // Int64 (Len): those addresses
	starts  *Tensor   // Int64 (Len+1): each tensor's first flat index, then Numel
	chunks  *Tensor   // Int64 (nchunks, 3): tensor, offset, length
	nchunks int
}

// listOf returns l's device tables, building them on first use or when a
// tensor's storage moved.
func (be cudaBackend) listOf(l *TensorList) *cudaList {
	c, ok := l.cache.(*cudaList)
	if ok && len(c.ptrs) == len(l.ts) {
		same := true
		for i, t := range l.ts {
			if be.ptr(t) != c.ptrs[i] {
				same = false
				break
			}
		}
		if same {
			return c
		}
	}
	c = &cudaList{ptrs: make([]uintptr, len(l.ts))}
	n := len(l.ts)
	ptrs, starts := New(Int64, max(n, 1)), New(Int64, n+1)
	var chunks []int64
	for i, t := range l.ts {
		c.ptrs[i] = be.ptr(t)
		ptrs.i64[i] = int64(c.ptrs[i])
		starts.i64[i] = int64(l.start[i])
		size := t.Numel()
		for off := 0; off < size; off += optimChunk {
			chunks = append(chunks, int64(i), int64(off), int64(min(optimChunk, size-off)))
		}
	}
	starts.i64[n] = int64(l.start[n])
	c.nchunks = len(chunks) / 3
	if c.nchunks == 0 {
		chunks = []int64{0, 0, 0}
	}
	ch := New(Int64, len(chunks)/3, 3)
	copy(ch.i64, chunks)
	c.ptrDev, c.starts, c.chunks = toCUDA(ptrs, siteListTables), toCUDA(starts, siteListTables), toCUDA(ch, siteListTables)
	l.cache = c
	return c
}

// launchChunks runs a list kernel with one block per chunk (grid-strided).
func (be cudaBackend) launchChunks(kernel string, c *cudaList, args ...any) {
	if c.nchunks == 0 {
		return
	}
	be.launch(kernel, [3]int{min(c.nchunks, optimBlocks), 1, 1}, [3]int{256, 1, 1}, 0, args...)
}

func (be cudaBackend) AdamW(params, grads, expAvg, expAvgSq *TensorList, coeffs []AdamWCoeffs) {
	if params.Numel() == 0 {
		return
	}
	p, g, m, v := be.listOf(params), be.listOf(grads), be.listOf(expAvg), be.listOf(expAvgSq)
	k := New(Float32, len(coeffs), 9)
	for i, c := range coeffs {
		copy(k.f32[9*i:], []float32{c.Beta1, c.Beta2, c.OneMinusBeta1, c.OneMinusBeta2, c.Eps, c.BC1, c.BC2, c.LR, c.WD})
	}
	kd := toCUDA(k, siteAdamWCoeffs)
	be.launchChunks("optim_adamw_f32", p, be.ptr(p.chunks), int64(p.nchunks), be.ptr(p.ptrDev), be.ptr(g.ptrDev),
		be.ptr(m.ptrDev), be.ptr(v.ptrDev), be.ptr(kd))
	runtime.KeepAlive(kd)
}

func (be cudaBackend) SGD(params, grads, momentum *TensorList, coeffs []SGDCoeffs) {
	if params.Numel() == 0 {
		return
	}
	p, g := be.listOf(params), be.listOf(grads)
	var bufs uintptr
	if momentum != nil {
		bufs = be.ptr(be.listOf(momentum).ptrDev)
	}
	k := New(Float32, len(coeffs), 6)
	for i, c := range coeffs {
		first, nesterov := float32(0), float32(0)
		if c.FirstStep {
			first = 1
		}
		if c.Nesterov {
			nesterov = 1
		}
		copy(k.f32[6*i:], []float32{c.LR, c.WD, c.Momentum, c.OneMinusDampening, first, nesterov})
	}
	kd := toCUDA(k, siteSGDCoeffs)
	be.launchChunks("optim_sgd_f32", p, be.ptr(p.chunks), int64(p.nchunks), be.ptr(p.ptrDev), be.ptr(g.ptrDev),
		bufs, be.ptr(kd))
	runtime.KeepAlive(kd)
}

func (be cudaBackend) ScaleList(l *TensorList, alpha float32) {
	if l.Numel() == 0 {
		return
	}
	c := be.listOf(l)
	be.launchChunks("optim_scale_f32", c, be.ptr(c.chunks), int64(c.nchunks), be.ptr(c.ptrDev), alpha)
}

// SumSquares sums each NormBlock on four threads into a scratch of
// float64s, then the blocks in order (one block stages them through shared
// memory, one thread adds) into out, on the device.
func (be cudaBackend) SumSquares(out *Tensor, l *TensorList) {
	total := l.Numel()
	if total == 0 {
		be.Fill(out, 0)
		return
	}
	c := be.listOf(l)
	nblocks := (total + NormBlock - 1) / NormBlock
	partial := be.empty(Int64, nblocks) // float64 bits
	be.launch("optim_sumsq_blocks_f32", [3]int{min((4*nblocks+255)/256, optimBlocks), 1, 1}, [3]int{256, 1, 1}, 0,
		be.ptr(partial), be.ptr(c.ptrDev), be.ptr(c.starts), int32(len(l.ts)), int64(nblocks), int64(NormBlock))
	be.launch("optim_sum_f64", [3]int{1, 1, 1}, [3]int{256, 1, 1}, 0, be.ptr(out), be.ptr(partial), int64(nblocks))
	runtime.KeepAlive(partial)
}

// MaxAbs reduces |x|'s float32 bits with an unsigned maximum (NaN above
// +Inf) and reads them back.
func (be cudaBackend) MaxAbs(l *TensorList) float64 {
	if l.Numel() == 0 {
		return 0
	}
	c := be.listOf(l)
	out := be.alloc(Int32, 1)
	be.launchChunks("optim_maxabs_f32", c, be.ptr(out), be.ptr(c.chunks), int64(c.nchunks), be.ptr(c.ptrDev))
	return float64(math.Float32frombits(uint32(fromCUDA(out, CPU, siteMaxAbs).Int32s()[0])))
}

// NonFinite clears out, then the kernel sets it where it finds a NaN or
// ±Inf (on the device).
func (be cudaBackend) NonFinite(out *Tensor, l *TensorList) {
	be.rt.timed("memset of a zeroed allocation", func() {
		if err := be.rt.dev.Memset(devPtr(out), 4); err != nil {
			panic(fmt.Sprintf("tensor: clearing NonFinite's result on CUDA: %v", err))
		}
	})
	if l.Numel() == 0 {
		return
	}
	c := be.listOf(l)
	be.launchChunks("optim_nonfinite_f32", c, be.ptr(out), be.ptr(c.chunks), int64(c.nchunks), be.ptr(c.ptrDev))
}
