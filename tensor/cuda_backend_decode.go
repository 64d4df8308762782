package tensor

import (
	"fmt"
	"math"
)

// The CUDA backend's decoding kernels (decode_ops.go, sampling_ops.go):
// internal/cuda/kernels/paged.cu, cuBLAS through Gemm, and, for sampling,
// the CPU backend's code on a host copy of the logits.

// AllocCommitted: device memory is backed when allocated, so a zeroed
// allocation is committed.
func (be cudaBackend) AllocCommitted(dtype DType, shape []int) *Tensor {
	return be.alloc(dtype, shape...)
}

// PagedKVWrite skips a slot outside the pool, where the CPU backend panics:
// checking on the host would read the slots back every decode step.
func (be cudaBackend) PagedKVWrite(kPool, vPool, k, v, slots *Tensor) {
	blocks, g, bt, d := kPool.Dim(0), kPool.Dim(1), kPool.Dim(2), kPool.Dim(3)
	n := k.Numel()
	if n == 0 {
		return
	}
	be.launch1D("paged_kv_write_f32", n, be.ptr(kPool), be.ptr(vPool), be.ptr(k), be.ptr(v), be.ptr(slots),
		int64(n), int32(g), int32(d), int32(bt), int32(blocks))
}

// pagedScratchBytes bounds the float64 scratch of one paged_attention_f32
// launch (scores of every (row, head) over the longest span a block table
// addresses); more rows are launched in chunks.
const pagedScratchBytes = 64 << 20

// PagedAttention runs in PagedAttention's fixed arithmetic, bit for bit
// the CPU's (paged.cu explains how). Spans that do not tile the rows, a
// position past a block table or a block outside the pool give NaN rows,
// where the CPU backend panics: checking on the host would read the tables
// back every decode step.
func (be cudaBackend) PagedAttention(out, q, kPool, vPool *Tensor, cfg PagedAttentionConfig) {
	rows, heads, d := q.Dim(0), q.Dim(1), q.Dim(2)
	blocks, groups, bt := kPool.Dim(0), kPool.Dim(1), kPool.Dim(2)
	seqs, maxBlocks := cfg.Spans.Dim(0), cfg.BlockTables.Dim(1)
	span := maxBlocks * bt
	if rows == 0 || heads == 0 || d == 0 {
		return
	}
	if span == 0 {
		panic(fmt.Sprintf("tensor: PagedAttention on the cuda backend: block tables %v address no position", cfg.BlockTables))
	}
	chunk := max(1, min(rows, pagedScratchBytes/(8*heads*span)))
	scratch := be.empty(Int64, chunk*heads*span) // float64 values, written before read
	scale := 1 / math.Sqrt(float64(d))
	for r0 := 0; r0 < rows; r0 += chunk {
		n := min(chunk, rows-r0)
		be.launch("paged_attention_f32", [3]int{n, heads, 1}, [3]int{pagedThreads, 1, 1}, 0,
			be.ptr(out), be.ptr(q), be.ptr(kPool), be.ptr(vPool), be.ptr(cfg.BlockTables), be.ptr(cfg.Spans),
			int32(seqs), int32(maxBlocks), int32(heads), int32(groups), int32(d), int32(bt), int32(blocks),
			scale, be.ptr(scratch), int64(span), int32(r0))
	}
}

// pagedThreads and sampleThreads are paged.cu's PAGED_THREADS and
// sample.cu's SAMPLE_THREADS (the argmax reduction assumes exactly that
// many).
const (
	pagedThreads  = 128
	sampleThreads = 256
)

// PackWeight keeps the weight on the device as a dense float32 (out, in)
// tensor, the operand of a cuBLAS product. BFloat16 storage is rounded to
// bfloat16 (Convert) and kept as float32 values: the products are the
// CPU's (x in float32 times the rounded weight), but the weight takes
// float32's bytes, not half of them (a bfloat16-weight kernel is a
// follow-up).
func (be cudaBackend) PackWeight(w *Tensor, dtype DType) *PackedWeight {
	out, in := w.Dim(0), w.Dim(1)
	dense := be.empty(Float32, out, in) // written whole below
	switch dtype {
	case Float32:
		if n := out * in; n > 0 {
			be.launch1D("paged_copy_u32", n, be.ptr(dense), be.ptr(w), int64(n))
		}
	case BFloat16:
		if out*in > 0 {
			rounded := be.empty(BFloat16, out, in)
			be.Convert(rounded, w)
			be.Convert(dense, rounded)
		}
	default:
		panic(fmt.Sprintf("tensor: PackWeight on the cuda backend: %v storage (want float32 or bfloat16)", dtype))
	}
	return &PackedWeight{out: out, in: in, dtype: dtype, dev: w.dev, bytes: int64(out) * int64(in) * 4, impl: dense}
}

// PackedLinear is cuBLAS's float32 product x·wᵀ, then the bias added to
// the rounded product in a separate pass (as the CPU adds it).
func (be cudaBackend) PackedLinear(out, x *Tensor, w *PackedWeight, b *Tensor) {
	dense, ok := w.impl.(*Tensor)
	if !ok || dense.dev != out.dev {
		panic(fmt.Sprintf("tensor: PackedLinear on the cuda backend: weight packed by another backend (%T)", w.impl))
	}
	if x.Dim(0) == 0 || w.out == 0 {
		return
	}
	be.Gemm(MatmulFP32, NoTrans, Trans, 1, x, dense, 0, out)
	if b != nil {
		n := out.Numel()
		be.launch1D("paged_bias_add_f32", n, be.ptr(out), be.ptr(b), int64(n), int32(w.out))
	}
}

// SampleTokens draws greedy-only steps (every draw top-k 1, no
// log-probabilities) on the device (sample.cu's argmax, the CPU's choice
// exactly). Any other step copies the logits and the outputs to the host
// and runs the CPU backend's sampler there: the same draws, bit for bit,
// at the price of a device-to-host copy of the logits (a device sampler
// for temperature, top-k and top-p is a follow-up).
func (be cudaBackend) SampleTokens(out SampledTokens, logits *Tensor, vocab int, draws []TokenSampling) {
	if len(draws) == 0 {
		return
	}
	greedy := true
	for _, d := range draws {
		greedy = greedy && d.TopK == 1 && !d.Logprob && d.TopLogprobs == 0
	}
	if greedy {
		rows := make([]int32, len(draws))
		for i, d := range draws {
			rows[i] = int32(d.Row)
		}
		rowsT := FromInt32(rows, len(rows)).ToDevice(out.IDs.dev)
		be.launch("sample_argmax_f32", [3]int{len(draws), 1, 1}, [3]int{sampleThreads, 1, 1}, 0,
			be.ptr(out.IDs), be.ptr(logits), be.ptr(rowsT), int32(logits.Dim(1)), int32(vocab))
		return
	}
	h := SampledTokens{IDs: ToHost(out.IDs)}
	if out.Logprobs != nil {
		h.Logprobs = ToHost(out.Logprobs) // draws that do not ask keep their values
	}
	if out.TopIDs != nil {
		h.TopIDs, h.TopLogprobs = ToHost(out.TopIDs), ToHost(out.TopLogprobs)
	}
	cpuBackend{}.SampleTokens(h, ToHost(logits), vocab, draws)
	be.decodeUpload(out.IDs, h.IDs)
	if out.Logprobs != nil {
		be.decodeUpload(out.Logprobs, h.Logprobs)
	}
	if out.TopIDs != nil {
		be.decodeUpload(out.TopIDs, h.TopIDs)
		be.decodeUpload(out.TopLogprobs, h.TopLogprobs)
	}
}

// TokenLogprobs runs the CPU backend's on host copies, as SampleTokens
// does: its float64 log-sum-exp is summed in column order, which a
// parallel device reduction would not reproduce bit for bit.
func (be cudaBackend) TokenLogprobs(out, logits, targets *Tensor, vocab int) {
	h := New(Float32, out.shape...)
	cpuBackend{}.TokenLogprobs(h, ToHost(logits), ToHost(targets), vocab)
	be.decodeUpload(out, h)
}

// decodeUpload copies the host tensor src into the device tensor dst (same
// shape, 4-byte elements, contiguous).
func (be cudaBackend) decodeUpload(dst, src *Tensor) {
	n := src.Numel()
	if n == 0 {
		return
	}
	if dst.Numel() != n || dst.dtype.Size() != 4 || src.dtype.Size() != 4 {
		panic(fmt.Sprintf("tensor: cuda upload of %v into %v", src, dst))
	}
	tmp := src.ToDevice(dst.dev)
	be.launch1D("paged_copy_u32", n, be.ptr(dst), be.ptr(tmp), int64(n))
}
