package tensor

import (
	"sync/atomic"
)

// The CUDA backend's tensor-core flash attention:
// internal/cuda/kernels/attntc.cu, FlashAttention-2's schedule on
// mma.sync.m16n8k16 with bf16 operands and float32 accumulators and softmax
// statistics. It serves calls whose AttentionConfig.Precision is
// MatmulBF16 (--bf16) and whose head dimension is 64 or 128, whole
// sequences and blocks (QPos, KPos, Accumulate) alike, while
// SetCUDAAttentionTensorCores is on; it then takes precedence over the
// materialized and the float32 flash paths. Built, not yet run on a GPU:
// off unless GOTRON_CUDA_UNVERIFIED names flash-tc (or is 1 or all).
// TestAttntcEmulation derives its tolerance against the CPU's float32
// attention from a host emulation of its rounding.

// attnTensorCores turns on the tensor-core flash attention (see
// SetCUDAAttentionTensorCores).
var attnTensorCores atomic.Bool

// SetCUDAAttentionTensorCores turns on (or off) the CUDA backend's
// tensor-core flash attention for calls with AttentionConfig.Precision
// MatmulBF16 and head dimension 64 or 128, and returns the previous
// setting. Off by default; OpenCUDA turns it on when
// GOTRON_CUDA_UNVERIFIED is 1, all or names flash-tc (CUDAUnverified): it
// is built but has not yet run on a GPU.
func SetCUDAAttentionTensorCores(on bool) bool { return attnTensorCores.Swap(on) }

// attntcApplies reports whether cfg runs on the tensor-core kernels.
func attntcApplies(cfg AttentionConfig) bool {
	return attnTensorCores.Load() && cfg.Precision == MatmulBF16 && (cfg.D == 64 || cfg.D == 128)
}

// attntc.cu's tile shapes: 128 threads; 64 queries per forward and dq
// block, 64 keys per key block and per dk/dv block; the dk/dv kernel's
// query blocks hold attntcDkvBQ(D) queries.
const (
	attntcThreads = 128
	attntcBQ      = 64
	attntcBK      = 64
	attntcPad     = 8 // bf16 elements of padding per shared row
)

func attntcDkvBQ(d int) int {
	if d <= 64 {
		return 64
	}
	return 32
}

// attntcSharedBytes is the dynamic shared memory of attntc.cu's kernel of
// kind "fwd", "dq" or "dkv" at head dimension d: its ATC_FWD_SMEM,
// ATC_DQ_SMEM and ATC_DKV_SMEM (each kernel traps when it gets fewer).
// At most 88,064 bytes (dq at d 128): within sm_80's 163 KiB and sm_86's
// 99 KiB per block.
func attntcSharedBytes(kind string, d int) int {
	ld, ldt := d+attntcPad, attntcBK+attntcPad
	switch kind {
	case "fwd":
		return 2 * (2*attntcBK*ld + d*ldt)
	case "dq":
		return 2 * (4*attntcBK*ld + d*ldt)
	case "dkv":
		bq := attntcDkvBQ(d)
		return 2*(2*attntcBK*ld+2*bq*ld+2*d*(bq+attntcPad)) + 20*bq
	}
	panic("tensor: attntcSharedBytes: unknown kernel kind " + kind)
}

// attntcName is the kernel of kind at head dimension d.
func attntcName(kind string, d int) string {
	suffix := "d64"
	if d > 64 {
		suffix = "d128"
	}
	if kind == "fwd" {
		return "attntc_fwd_" + suffix + "_bf16"
	}
	return "attntc_bwd_" + kind + "_" + suffix + "_bf16"
}

// attntcForward is AttentionForward on the tensor-core kernels.
func (be cudaBackend) attntcForward(out, lse, q, k, v *Tensor, cfg AttentionConfig, a cudaAttn) {
	be.launch(attntcName("fwd", cfg.D), [3]int{attnCeilDiv(cfg.T, attntcBQ), cfg.HQ, cfg.B}, [3]int{attntcThreads, 1, 1},
		attntcSharedBytes("fwd", cfg.D),
		attntcFwdArgs(be.ptr(out), be.ptr(lse), be.ptr(q), be.ptr(k), be.ptr(v), a, cfg.T, cfg.HQ, cfg.HKV)...)
}

// attntcBackward is AttentionBackward on the tensor-core kernels: delta
// (attn.cu's float32 kernel), then dq, then dk and dv, each added to.
func (be cudaBackend) attntcBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig, a cudaAttn) {
	delta := be.empty(Float32, cfg.B, cfg.HQ, cfg.T)
	defer delta.dbuf.free()
	rows := cfg.B * cfg.T * cfg.HQ
	be.launch("attn_bwd_delta_f32", [3]int{min(attnCeilDiv(rows, attnDeltaWarp), 1<<20), 1, 1}, [3]int{32 * attnDeltaWarp, 1, 1}, 0,
		be.ptr(delta), be.ptr(dout), be.ptr(out), int64(rows), int32(cfg.T), int32(cfg.HQ), int32(cfg.D))
	ptrs := attntcBwdPtrs{dout: be.ptr(dout), q: be.ptr(q), k: be.ptr(k), v: be.ptr(v), lse: be.ptr(lse), delta: be.ptr(delta)}
	be.launch(attntcName("dq", cfg.D), [3]int{attnCeilDiv(cfg.T, attntcBQ), cfg.HQ, cfg.B}, [3]int{attntcThreads, 1, 1},
		attntcSharedBytes("dq", cfg.D), attntcDqArgs(be.ptr(dq), ptrs, a, cfg.T, cfg.HQ, cfg.HKV)...)
	be.launch(attntcName("dkv", cfg.D), [3]int{attnCeilDiv(cfg.T, attntcBK), cfg.HKV, cfg.B}, [3]int{attntcThreads, 1, 1},
		attntcSharedBytes("dkv", cfg.D), attntcDkvArgs(be.ptr(dk), be.ptr(dv), ptrs, a, cfg.T, cfg.HQ, cfg.HKV)...)
}

// attntcBwdPtrs are the backward kernels' shared inputs.
type attntcBwdPtrs struct{ dout, q, k, v, lse, delta uintptr }

// attntcFwdArgs, attntcDqArgs and attntcDkvArgs are the kernels' argument
// lists (TestAttntcArgsMatchPTX checks them against the PTX parameters).
func attntcFwdArgs(out, lse, q, k, v uintptr, a cudaAttn, T, HQ, HKV int) []any {
	return []any{out, lse, q, k, v, a.docs, int32(T), int32(HQ), int32(HKV), a.scale, a.causal, a.dropout, a.thr,
		a.dscale, a.seed, a.firstHead, a.qpos, a.kpos, a.accum}
}

func attntcDqArgs(dq uintptr, p attntcBwdPtrs, a cudaAttn, T, HQ, HKV int) []any {
	return []any{dq, p.dout, p.q, p.k, p.v, p.lse, p.delta, a.docs, int32(T), int32(HQ), int32(HKV), a.scale, a.causal,
		a.dropout, a.thr, a.dscale, a.seed, a.firstHead, a.qpos, a.kpos}
}

func attntcDkvArgs(dk, dv uintptr, p attntcBwdPtrs, a cudaAttn, T, HQ, HKV int) []any {
	return []any{dk, dv, p.dout, p.q, p.k, p.v, p.lse, p.delta, a.docs, int32(T), int32(HQ), int32(HKV), a.scale,
		a.causal, a.dropout, a.thr, a.dscale, a.seed, a.firstHead, a.qpos, a.kpos}
}
