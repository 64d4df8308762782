package tensor

import "fmt"

// Decoding ops: inference-only kernels (no gradients) that a serving engine
// drives step by step. Each checks shapes and dtypes here, as the tape ops
// do, and reaches arithmetic through the Backend, so a device backend
// receives its own buffers: the KV pool, the block tables and the packed
// weights live wherever the backend keeps them.

// CPUBackend returns the CPU backend (internal/cpu's kernels on host
// memory): the reference a device backend's conformance checks
// (tensor/backendtest) compare against, and the backend of every tensor
// today.
func CPUBackend() Backend { return cpuBackend{} }

// NewCommitted returns a zeroed float32 tensor on dev whose memory is
// committed now, for long-lived buffers such as a KV pool: an allocation
// the machine cannot back then fails at start-up, not in the middle of a
// request, and the first step that writes it does not fault its pages in
// one by one.
func NewCommitted(dev Device, shape ...int) *Tensor {
	return backendOn(dev).AllocCommitted(Float32, shape)
}

// backendOn returns the backend of tensors on dev.
func backendOn(dev Device) Backend { return backendFor(&Tensor{dev: dev}) }

// PagedAttentionConfig locates each query row's keys and values in a paged
// KV cache for PagedAttention. The rows of a step are grouped by sequence:
// sequence s owns rows [row, row+n) — consecutive, and the sequences' runs
// tile the rows in order — which sit at positions [pos, pos+n) of that
// sequence, so row row+i attends to its sequence's positions 0..pos+i.
// Position p of sequence s is kept at offset p mod B of block
// BlockTables[s, p/B] (B the pool's positions per block).
//
// A single sequence with a contiguous cache is the case of one sequence and
// one block of MaxLen positions: BlockTables [[0]], Spans [[0, n, pos]].
type PagedAttentionConfig struct {
	// BlockTables (seqs, maxBlocks) int32: each sequence's block ids in
	// position order. Entries past a sequence's last needed block are not
	// read.
	BlockTables *Tensor
	// Spans (seqs, 3) int32: per sequence its first row, its number of
	// rows n, and the position of its first row.
	Spans *Tensor
}

// PagedAttention computes, for every query row of q (rows, heads, head
// dim), the causal attention over its own sequence's positions in the paged
// pools kPool and vPool (blocks, groups, B, head dim; a block keeps each KV
// head's B positions contiguously, as vLLM's blocks do), and writes it into
// out (rows, heads, head dim), overwriting it. Query head h reads KV head
// h/(heads/groups) (grouped-query attention). The keys and values of the
// rows themselves must be in the pools already (PagedKVWrite).
//
// The arithmetic is fixed, so that every backend and every split of the
// work give the same bits: each score is the float64 dot product of the
// query and key — element i fused-multiply-added into partial sum i mod 16,
// the 16 partial sums added in order — times 1/√(head dim); the weights are
// float32(exp(s−max)/Σexp(s−max)) with float64 sums in position order; and
// out is Σ_j w_j·v_j accumulated in float32, one multiply and one add per
// element, positions in order.
func PagedAttention(out, q, kPool, vPool *Tensor, cfg PagedAttentionConfig) {
	mustF32("PagedAttention", out, q, kPool, vPool)
	if q.NDim() != 3 || !SameShape(out.shape, q.shape) {
		panic(fmt.Sprintf("tensor: PagedAttention: q %v and out %v must be (rows, heads, head dim) alike", q.shape, out.shape))
	}
	if kPool.NDim() != 4 || !SameShape(kPool.shape, vPool.shape) || kPool.Dim(3) != q.Dim(2) {
		panic(fmt.Sprintf("tensor: PagedAttention: pools %v and %v must be (blocks, groups, block positions, %d)", kPool.shape, vPool.shape, q.Dim(2)))
	}
	if g := kPool.Dim(1); g == 0 || q.Dim(1)%g != 0 {
		panic(fmt.Sprintf("tensor: PagedAttention: %d query heads for %d KV heads", q.Dim(1), g))
	}
	mustContiguous("PagedAttention", out, q, kPool, vPool)
	checkPagedTables("PagedAttention", cfg)
	backendFor(out, q, kPool, vPool, cfg.BlockTables, cfg.Spans).PagedAttention(out, q, kPool, vPool, cfg)
}

// checkPagedTables checks cfg's shapes and dtypes.
func checkPagedTables(op string, cfg PagedAttentionConfig) {
	bt, sp := cfg.BlockTables, cfg.Spans
	if bt == nil || sp == nil {
		panic(fmt.Sprintf("tensor: %s: BlockTables and Spans are required", op))
	}
	if bt.dtype != Int32 || sp.dtype != Int32 || bt.NDim() != 2 || sp.NDim() != 2 || sp.Dim(1) != 3 || bt.Dim(0) != sp.Dim(0) {
		panic(fmt.Sprintf("tensor: %s: BlockTables %v and Spans %v must be int32 (seqs, max blocks) and (seqs, 3)", op, bt, sp))
	}
	mustContiguous(op, bt, sp)
}

// PagedKVWrite stores the keys k and values v (rows, groups, head dim) of
// new positions into the paged pools kPool and vPool (blocks, groups, B,
// head dim): row i goes to slot slots[i] (int32, rows), that is block
// slots[i]/B at offset slots[i] mod B. The values are copied exactly.
func PagedKVWrite(kPool, vPool, k, v, slots *Tensor) {
	mustF32("PagedKVWrite", kPool, vPool, k, v)
	if k.NDim() != 3 || !SameShape(k.shape, v.shape) {
		panic(fmt.Sprintf("tensor: PagedKVWrite: k %v and v %v must be (rows, groups, head dim) alike", k.shape, v.shape))
	}
	if kPool.NDim() != 4 || !SameShape(kPool.shape, vPool.shape) || kPool.Dim(1) != k.Dim(1) || kPool.Dim(3) != k.Dim(2) {
		panic(fmt.Sprintf("tensor: PagedKVWrite: pools %v and %v must be (blocks, %d, block positions, %d)", kPool.shape, vPool.shape, k.Dim(1), k.Dim(2)))
	}
	if slots.dtype != Int32 || slots.NDim() != 1 || slots.Dim(0) != k.Dim(0) {
		panic(fmt.Sprintf("tensor: PagedKVWrite: slots %v must be int32 (%d)", slots, k.Dim(0)))
	}
	mustContiguous("PagedKVWrite", kPool, vPool, k, v, slots)
	backendFor(kPool, vPool, k, v, slots).PagedKVWrite(kPool, vPool, k, v, slots)
}

func mustContiguous(op string, ts ...*Tensor) {
	for _, t := range ts {
		if !t.IsContiguous() {
			panic(fmt.Sprintf("tensor: %s: %v is not contiguous", op, t))
		}
	}
}

// PackedWeight is a linear layer's weight w (out, in) prepared by a backend
// for repeated products x·wᵀ: a served model's weights, read by every decode
// step. The CPU packs them into its GEMM micro-kernels' strips
// (internal/cpu.PackB), so a step streams each weight once, in order, with
// no repacking. A PackedWeight is immutable and safe for concurrent use.
type PackedWeight struct {
	out, in int
	dtype   DType
	dev     Device
	bytes   int64
	impl    any // the backend's form (the CPU's: *cpu.PackedB)
}

// Device returns the device holding the packed weight: the weight's.
func (w *PackedWeight) Device() Device { return w.dev }

// Out returns the weight's output features (its rows).
func (w *PackedWeight) Out() int { return w.out }

// In returns the weight's input features (its columns).
func (w *PackedWeight) In() int { return w.in }

// DType returns the element type the weight is stored in.
func (w *PackedWeight) DType() DType { return w.dtype }

// Bytes returns the memory the packed copy takes.
func (w *PackedWeight) Bytes() int64 { return w.bytes }

// PackWeight prepares w (out, in), float32, for LinearPacked, stored in
// dtype: Float32 (products with exactly Linear's bits wherever the GEMM
// packs its B operand for Linear too) or BFloat16 (w rounded to nearest
// even: half the bytes, exact for a w whose values are bfloat16 already).
func PackWeight(w *Tensor, dtype DType) *PackedWeight {
	mustF32("PackWeight", w)
	if w.NDim() != 2 {
		panic(fmt.Sprintf("tensor: PackWeight: weight %v is not (out, in)", w))
	}
	if dtype != Float32 && dtype != BFloat16 {
		panic(fmt.Sprintf("tensor: PackWeight: %v storage (want float32 or bfloat16)", dtype))
	}
	return backendFor(w).PackWeight(w.Contiguous(), dtype)
}

// LinearPacked returns x·wᵀ + b for x (..., in), w packed by PackWeight and
// b (out) or nil, as Linear would (the bias added to the rounded product),
// in w's packed arithmetic. It records no gradient: decoding only, so an
// input that requires one on a recording tape is an error.
func (tp *Tape) LinearPacked(x *Tensor, w *PackedWeight, b *Tensor) *Tensor {
	mustF32("LinearPacked", x, b)
	if x.Dim(-1) != w.in {
		panic(fmt.Sprintf("tensor: LinearPacked input %v does not match weight (%d, %d)", x.shape, w.out, w.in))
	}
	if b != nil && (b.NDim() != 1 || b.Dim(0) != w.out) {
		panic(fmt.Sprintf("tensor: LinearPacked bias %v for %d outputs", b.shape, w.out))
	}
	if tp.recording(x, b) {
		panic("tensor: LinearPacked records no gradient; use Linear on a recording tape")
	}
	if x.dev != w.dev {
		panic(fmt.Sprintf("tensor: LinearPacked of %v on %v with a weight packed on %v", x, x.dev, w.dev))
	}
	x = tp.Contiguous(x)
	rows := x.Numel() / w.in
	shape := append(append([]int(nil), x.shape[:len(x.shape)-1]...), w.out)
	out := tp.empty(x.dev, shape...)
	if b != nil {
		b = b.Contiguous()
	}
	backendFor(x, b).PackedLinear(out.view([]int{rows, w.out}, []int{w.out, 1}, 0), x.view([]int{rows, w.in}, []int{w.in, 1}, x.offset), w, b)
	return out
}
