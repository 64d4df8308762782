package tensor

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/cuda"
)

// The CUDA backend's fused attention: internal/cuda/kernels/attn.cu, a
// flash-attention style float32 kernel on CUDA cores (no tensor cores yet),
// for calls whose scores exceed attnMaterializedMaxBytes per batch row;
// smaller calls take the materialized cuBLAS path of
// cuda_backend_attnmat.go, and bf16 calls at head dimension 64 or 128 the
// tensor-core kernels of cuda_backend_attntc.go while those are on.
// Semantics are internal/cpu's (masks, rows with no allowed key, lse before
// dropout, the keyed dropout masks bit for bit); sums run in another order,
// so values agree with the CPU within float32 rounding, not bit for bit.
// The backward is deterministic (no atomics): dq by query tiles, dk and dv
// by key tiles.

// attnMaxHeadDim is the largest head dimension the attention kernels take:
// their q, k, v tiles sit in 48 KiB of static shared memory.
const attnMaxHeadDim = 128

// cudaAttn is an attention call's kernel arguments.
type cudaAttn struct {
	suffix    string // "d64" or "d128": the instantiation for the head dimension
	fwdRows   int    // the forward's query rows per block for that instantiation
	bwdRows   int    // the backward's query rows (dq) and keys (dk, dv) per block
	docs      uintptr
	scale     float32
	causal    int32
	dropout   int32
	thr       uint32 // p·2³² rounded down: a hash below it drops
	dscale    float32
	seed      uint64
	firstHead int32
	qpos      int32 // block attention: the positions of q's and k's row 0
	kpos      int32
	accum     int32            // 1: merge into out and lse (AttentionConfig.Accumulate)
	compute   cuda.ComputeType // the materialized path's cuBLAS products
}

// cudaAttnArgs checks cfg as the CPU kernels do and converts it. op names the
// method in panics.
func (be cudaBackend) cudaAttnArgs(op string, cfg AttentionConfig) cudaAttn {
	// The CPU's checks, without DocIDs (their storage is on the device; the
	// op checked their shape).
	c := cpu.AttentionConfig{B: cfg.B, T: cfg.T, HQ: cfg.HQ, HKV: cfg.HKV, D: cfg.D, Scale: cfg.Scale, Causal: cfg.Causal,
		Dropout: cfg.Dropout, DropoutSeed: cfg.DropoutSeed, FirstHead: cfg.FirstHead, QPos: cfg.QPos, KPos: cfg.KPos}
	if err := c.Validate(); err != nil {
		panic(fmt.Sprintf("tensor: %s on the cuda backend: %v", op, err))
	}
	if cfg.DocIDs != nil && (cfg.QPos != 0 || cfg.KPos != 0) {
		panic(fmt.Sprintf("tensor: %s on the cuda backend: DocIDs with QPos=%d KPos=%d: document masks need whole sequences (offsets 0)", op, cfg.QPos, cfg.KPos))
	}
	block := cfg.QPos != 0 || cfg.KPos != 0 || cfg.Accumulate
	if block && attnmatChunk(cfg) == 0 && !attntcApplies(cfg) {
		// Block attention (context parallelism) is built on the materialized
		// and the tensor-core paths only; train refuses --context-parallel-size > 1 with --device
		// cuda unless GOTRON_CUDA_UNVERIFIED=1 until a GPU run checks it.
		panic(fmt.Sprintf("tensor: %s on the cuda backend: block attention (QPos=%d KPos=%d Accumulate=%v, context parallelism) runs on the materialized path only, and one batch row's scores (%d heads × %d² float32) exceed its limit of %d bytes (tensor.SetCUDAAttentionScoresLimit); the flash kernels have no query/key offsets yet",
			op, cfg.QPos, cfg.KPos, cfg.Accumulate, cfg.HQ, cfg.T, attnMaterializedMaxBytes.Load()))
	}
	if cfg.QPos > math.MaxInt32-cfg.T || cfg.KPos > math.MaxInt32-cfg.T {
		panic(fmt.Sprintf("tensor: %s on the cuda backend: QPos=%d KPos=%d T=%d: positions beyond int32", op, cfg.QPos, cfg.KPos, cfg.T))
	}
	a := cudaAttn{scale: cfg.Scale, seed: cfg.DropoutSeed, firstHead: int32(cfg.FirstHead),
		qpos: int32(cfg.QPos), kpos: int32(cfg.KPos), compute: attnmatComputeFor(cfg)}
	if cfg.Accumulate {
		a.accum = 1
	}
	switch {
	case cfg.D <= 64:
		a.suffix, a.fwdRows, a.bwdRows = "d64", 32, 16
	case cfg.D <= attnMaxHeadDim:
		a.suffix, a.fwdRows, a.bwdRows = "d128", 16, 12
	case attnmatChunk(cfg) > 0:
		// the materialized path (cuda_backend_attnmat.go) has no limit
	case attnByHeads(cfg) > 0:
		// chunks of heads on the materialized path (attention_heads.go)
	default:
		panic(fmt.Sprintf("tensor: %s on the cuda backend: head dimension %d is above the flash kernels' limit of %d, and one batch row's scores (%d heads × %d² float32) exceed the materialized path's limit of %d bytes (tensor.SetCUDAAttentionScoresLimit); GOTRON_CUDA_UNVERIFIED=mla runs it by chunks of heads (built, not yet run on a GPU)",
			op, cfg.D, attnMaxHeadDim, cfg.HQ, cfg.T, attnMaterializedMaxBytes.Load()))
	}
	if a.scale == 0 {
		a.scale = float32(1 / math.Sqrt(float64(cfg.D)))
	}
	if cfg.Causal {
		a.causal = 1
	}
	if cfg.Dropout > 0 { // internal/cpu's dropThreshold and dropScale
		a.dropout = 1
		a.thr = uint32(float64(cfg.Dropout) * (1 << 32))
		a.dscale = float32(1 / (1 - float64(cfg.Dropout)))
	}
	if cfg.DocIDs != nil {
		a.docs = be.ptr(cfg.DocIDs)
	}
	return a
}

// attn.cu's block size (its tiles, 4 warps × ROWS or KEYS, are
// cudaAttn.fwdRows and bwdRows).
const (
	attnThreads   = 128
	attnDeltaWarp = 8 // warps per block of attn_bwd_delta_f32
)

func (be cudaBackend) AttentionForward(out, lse, q, k, v *Tensor, cfg AttentionConfig) {
	a := be.cudaAttnArgs("AttentionForward", cfg)
	if cfg.B == 0 || cfg.T == 0 {
		return
	}
	if attntcApplies(cfg) {
		be.attntcForward(out, lse, q, k, v, cfg, a)
		return
	}
	if bc := attnmatChunk(cfg); bc > 0 {
		be.attnmatForward(out, lse, q, k, v, cfg, a, bc)
		return
	}
	if hc := attnByHeads(cfg); hc > 0 {
		attentionForwardByHeads(be, out, lse, q, k, v, cfg, hc)
		return
	}
	be.launch("attn_fwd_"+a.suffix+"_f32", [3]int{attnCeilDiv(cfg.T, a.fwdRows), cfg.HQ, cfg.B}, [3]int{attnThreads, 1, 1}, 0,
		be.ptr(out), be.ptr(lse), be.ptr(q), be.ptr(k), be.ptr(v), a.docs,
		int32(cfg.T), int32(cfg.HQ), int32(cfg.HKV), int32(cfg.D), a.scale, a.causal, a.dropout, a.thr, a.dscale, a.seed, a.firstHead)
}

func (be cudaBackend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig) {
	a := be.cudaAttnArgs("AttentionBackward", cfg)
	if cfg.B == 0 || cfg.T == 0 {
		return
	}
	if attntcApplies(cfg) {
		be.attntcBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg, a)
		return
	}
	if bc := attnmatChunk(cfg); bc > 0 {
		be.attnmatBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg, a, bc)
		return
	}
	if hc := attnByHeads(cfg); hc > 0 {
		attentionBackwardByHeads(be, dq, dk, dv, dout, q, k, v, out, lse, cfg, hc)
		return
	}
	// delta_i = dout_i·out_i, (B, HQ, T) like lse (every element written)
	delta := be.empty(Float32, cfg.B, cfg.HQ, cfg.T)
	rows := cfg.B * cfg.T * cfg.HQ
	be.launch("attn_bwd_delta_f32", [3]int{min(attnCeilDiv(rows, attnDeltaWarp), 1<<20), 1, 1}, [3]int{32 * attnDeltaWarp, 1, 1}, 0,
		be.ptr(delta), be.ptr(dout), be.ptr(out), int64(rows), int32(cfg.T), int32(cfg.HQ), int32(cfg.D))
	be.launch("attn_bwd_dq_"+a.suffix+"_f32", [3]int{attnCeilDiv(cfg.T, a.bwdRows), cfg.HQ, cfg.B}, [3]int{attnThreads, 1, 1}, 0,
		be.ptr(dq), be.ptr(dout), be.ptr(q), be.ptr(k), be.ptr(v), be.ptr(lse), be.ptr(delta), a.docs,
		int32(cfg.T), int32(cfg.HQ), int32(cfg.HKV), int32(cfg.D), a.scale, a.causal, a.dropout, a.thr, a.dscale, a.seed, a.firstHead)
	be.launch("attn_bwd_dkv_"+a.suffix+"_f32", [3]int{attnCeilDiv(cfg.T, a.bwdRows), cfg.HKV, cfg.B}, [3]int{attnThreads, 1, 1}, 0,
		be.ptr(dk), be.ptr(dv), be.ptr(dout), be.ptr(q), be.ptr(k), be.ptr(v), be.ptr(lse), be.ptr(delta), a.docs,
		int32(cfg.T), int32(cfg.HQ), int32(cfg.HKV), int32(cfg.D), a.scale, a.causal, a.dropout, a.thr, a.dscale, a.seed, a.firstHead)
}

// attnCeilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func attnCeilDiv(a, b int) int { return (a + b - 1) / b }
