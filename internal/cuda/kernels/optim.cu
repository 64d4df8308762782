// Multi-tensor optimizer updates and gradient statistics of the CUDA
// backend (tensor/cuda_backend_optim.go), after tensor/optim_ops.go and
// cpu_backend_optim.go: one launch covers every tensor of a list, as
// Apex's multi_tensor_apply does.
//
// A list reaches a kernel as a device table of its tensors' addresses
// (ptrs, one uint64 per tensor; a second list's table has the same
// layout) and either a chunk table (chunks: int64 triples tensor, offset,
// length, no chunk crossing a tensor; the element kernels take one chunk
// per block, grid-strided) or the flat starts (starts[i] = tensor i's
// first flat index, starts[ntensors] = the total; the NormBlock
// statistics find their tensors by binary search).
//
// The updates round every product, quotient and sum to float32 in the
// order tensor.AdamW and tensor.SGD document, with __fmul_rn and friends
// (never fused into a multiply-add), so they are the CPU's bit for bit.
// SumSquares follows tensor.NormBlock's fixed order (also bit for bit);
// MaxAbs and NonFinite do not depend on order.

#include <stdint.h>

#define OPTIM_CHUNK_LOOP(ch, nchunks) for (long long ch = blockIdx.x; ch < (nchunks); ch += gridDim.x)

// AdamW on every chunk: coeffs holds 9 float32 per tensor in
// tensor.AdamWCoeffs's field order (Beta1, Beta2, OneMinusBeta1,
// OneMinusBeta2, Eps, BC1, BC2, LR, WD).
extern "C" __global__ void __launch_bounds__(256) optim_adamw_f32(const long long* chunks, long long nchunks, const uint64_t* pp,
                                           const uint64_t* gp, const uint64_t* mp, const uint64_t* vp,
                                           const float* coeffs) {
    OPTIM_CHUNK_LOOP(ch, nchunks) {
        const long long ti = chunks[3 * ch], off = chunks[3 * ch + 1], len = chunks[3 * ch + 2];
        float* p = (float*)pp[ti] + off;
        const float* g = (const float*)gp[ti] + off;
        float* m = (float*)mp[ti] + off;
        float* v = (float*)vp[ti] + off;
        const float* k = coeffs + 9 * ti;
        const float b1 = k[0], b2 = k[1], omb1 = k[2], omb2 = k[3], eps = k[4], bc1 = k[5], bc2 = k[6], lr = k[7],
                    wd = k[8];
        for (long long j = threadIdx.x; j < len; j += blockDim.x) {
            const float gj = g[j];
            const float mj = __fadd_rn(__fmul_rn(b1, m[j]), __fmul_rn(omb1, gj));
            const float vj = __fadd_rn(__fmul_rn(b2, v[j]), __fmul_rn(__fmul_rn(omb2, gj), gj));
            m[j] = mj;
            v[j] = vj;
            const float denom = __fadd_rn((float)sqrt((double)__fdiv_rn(vj, bc2)), eps);
            const float pj = p[j];
            const float step = __fadd_rn(__fdiv_rn(__fdiv_rn(mj, bc1), denom), __fmul_rn(wd, pj));
            p[j] = __fsub_rn(pj, __fmul_rn(lr, step));
        }
    }
}

// SGD on every chunk: coeffs holds 6 float32 per tensor (LR, WD, Momentum,
// OneMinusDampening, FirstStep 0/1, Nesterov 0/1); bp (the momentum
// buffers' table) is null without a buffer.
extern "C" __global__ void __launch_bounds__(256) optim_sgd_f32(const long long* chunks, long long nchunks, const uint64_t* pp,
                                         const uint64_t* gp, const uint64_t* bp, const float* coeffs) {
    OPTIM_CHUNK_LOOP(ch, nchunks) {
        const long long ti = chunks[3 * ch], off = chunks[3 * ch + 1], len = chunks[3 * ch + 2];
        float* p = (float*)pp[ti] + off;
        const float* g = (const float*)gp[ti] + off;
        float* buf = bp != nullptr ? (float*)bp[ti] + off : nullptr;
        const float* k = coeffs + 6 * ti;
        const float lr = k[0], wd = k[1], mom = k[2], omd = k[3];
        const bool first = k[4] != 0.0f, nesterov = k[5] != 0.0f;
        for (long long j = threadIdx.x; j < len; j += blockDim.x) {
            const float pj = p[j];
            float d = g[j];
            if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, pj));
            if (buf != nullptr) {
                float b;
                if (first) {
                    b = d;
                } else {
                    b = __fadd_rn(__fmul_rn(mom, buf[j]), __fmul_rn(omd, d));
                }
                buf[j] = b;
                if (nesterov) {
                    d = __fadd_rn(d, __fmul_rn(mom, b));
                } else {
                    d = b;
                }
            }
            p[j] = __fsub_rn(pj, __fmul_rn(lr, d));
        }
    }
}

// x *= alpha on every chunk.
extern "C" __global__ void __launch_bounds__(256) optim_scale_f32(const long long* chunks, long long nchunks, const uint64_t* xp,
                                           float alpha) {
    OPTIM_CHUNK_LOOP(ch, nchunks) {
        const long long ti = chunks[3 * ch], off = chunks[3 * ch + 1], len = chunks[3 * ch + 2];
        float* x = (float*)xp[ti] + off;
        for (long long j = threadIdx.x; j < len; j += blockDim.x) x[j] = __fmul_rn(x[j], alpha);
    }
}

// out[0] = max |x| over every chunk as the bits of a non-negative float32:
// for those, unsigned order is float order, and a NaN (sign cleared) is
// above +Inf, so the maximum is NaN when any element is. out[0] starts 0.
extern "C" __global__ void __launch_bounds__(256) optim_maxabs_f32(unsigned int* out, const long long* chunks, long long nchunks,
                                            const uint64_t* xp) {
    unsigned int mx = 0;
    OPTIM_CHUNK_LOOP(ch, nchunks) {
        const long long ti = chunks[3 * ch], off = chunks[3 * ch + 1], len = chunks[3 * ch + 2];
        const unsigned int* x = (const unsigned int*)xp[ti] + off;
        for (long long j = threadIdx.x; j < len; j += blockDim.x) mx = max(mx, x[j] & 0x7fffffffu);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0 && mx != 0) atomicMax(out, mx);
}

// out[0] = 1 when any element of any chunk is NaN or ±Inf (exponent all
// ones). out[0] starts 0.
extern "C" __global__ void __launch_bounds__(256) optim_nonfinite_f32(unsigned int* out, const long long* chunks, long long nchunks,
                                               const uint64_t* xp) {
    unsigned int bad = 0;
    OPTIM_CHUNK_LOOP(ch, nchunks) {
        const long long ti = chunks[3 * ch], off = chunks[3 * ch + 1], len = chunks[3 * ch + 2];
        const unsigned int* x = (const unsigned int*)xp[ti] + off;
        for (long long j = threadIdx.x; j < len; j += blockDim.x) bad |= (x[j] & 0x7f800000u) == 0x7f800000u;
    }
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(out, 1u);
}

// SumSquares, pass 1: partial[blk] = Σ x² over NormBlock blk of the flat
// index space [blk·normBlock, +normBlock), exactly as tensor.NormBlock
// defines it: the block's piece of each tensor summed in float64 with four
// interleaved accumulators (element k of the piece into s[k mod 4] while
// whole groups of four remain, the rest into s[0]), (s0+s1)+(s2+s3), the
// pieces added in order. Four lanes take one block, lane q holding s[q];
// every lane of a group runs the same loop, so the group's shuffles see
// all four. blockDim.x must be a multiple of 32.
extern "C" __global__ void __launch_bounds__(256) optim_sumsq_blocks_f32(double* partial, const uint64_t* xp, const long long* starts,
                                                  int ntensors, long long nblocks, long long normBlock) {
    const int lane = threadIdx.x & 31, q = lane & 3;
    const unsigned int group = 0xfu << (lane & ~3);
    const long long total = starts[ntensors];
    const long long groups = ((long long)gridDim.x * blockDim.x) >> 2;
    for (long long blk = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 2; blk < nblocks; blk += groups) {
        const long long lo = blk * normBlock, hi = min(total, lo + normBlock);
        // The first tensor whose end is past lo.
        int a = 0, b = ntensors - 1;
        while (a < b) {
            const int mid = (a + b) >> 1;
            if (starts[mid + 1] > lo) {
                b = mid;
            } else {
                a = mid + 1;
            }
        }
        double block = 0.0;
        for (int i = a; i < ntensors && starts[i] < hi; i++) {
            const long long pa = max(lo, starts[i]) - starts[i], pb = min(hi, starts[i + 1]) - starts[i];
            if (pa >= pb) continue;
            const float* x = (const float*)xp[i] + pa;
            const long long len = pb - pa, whole = len & ~3LL;
            double s = 0.0;
#pragma unroll 4
            for (long long k = q; k < whole; k += 4) {
                const double v = (double)x[k];
                s = __dadd_rn(s, __dmul_rn(v, v));
            }
            if (q == 0) {
                for (long long k = whole; k < len; k++) {
                    const double v = (double)x[k];
                    s = __dadd_rn(s, __dmul_rn(v, v));
                }
            }
            const double s1 = __shfl_down_sync(group, s, 1, 4);
            const double s2 = __shfl_down_sync(group, s, 2, 4);
            const double s3 = __shfl_down_sync(group, s, 3, 4);
            if (q == 0) block = __dadd_rn(block, __dadd_rn(__dadd_rn(s, s1), __dadd_rn(s2, s3)));
        }
        if (q == 0) partial[blk] = block;
    }
}

// SumSquares, pass 2 (one block of 256 threads): out[0] = Σ partial in
// order. The block stages tiles of the partials in shared memory (loads
// coalesced and in flight together), and thread 0 adds each tile in order.
extern "C" __global__ void __launch_bounds__(256) optim_sum_f64(double* out, const double* partial, long long n) {
    __shared__ double tile[1024];
    double s = 0.0;
    for (long long base = 0; base < n; base += 1024) {
        const int m = (int)min(1024LL, n - base);
        for (int i = threadIdx.x; i < m; i += blockDim.x) tile[i] = partial[base + i];
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < m; i++) s = __dadd_rn(s, tile[i]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s;
}
