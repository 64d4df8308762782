// Reductions of the CUDA backend (tensor/cuda_backend_reduce.go): column
// and whole-tensor sums, per-row sums, maxima, argmaxima and softmax (one
// block per row, rows grid-strided over the blocks), and the loss-mask
// mean and its gradient. Accumulation is in float32 where the CPU's is
// (float64 where it is), but in a tree order, so sums differ from the
// CPU's sequential ones in the last bits.
//
// Row kernels need blockDim.x a multiple of 32 (at most 1024) and every
// thread of a block to reach each block reduction (no early return).

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// Block-wide sum of v, returned to every thread. shm holds 32 values; the
// leading barrier lets a loop reuse it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? shm[lane] : T(0);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) shm[0] = v;
    }
    __syncthreads();
    return shm[0];
}

// Block-wide maximum (fmaxf: a NaN loses to a number).
__device__ __forceinline__ float block_max(float v, float* shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? shm[lane] : -INFINITY;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) shm[0] = v;
    }
    __syncthreads();
    return shm[0];
}

// SumRows, pass 1: partial[chunk, j] = Σ of x[r, j] over the chunk's
// rows [chunk·rowsPerChunk, +rowsPerChunk). Blocks of 32×8 threads: x
// columns, y rows (strided by 8), then the 8 row sums added in order.
extern "C" __global__ void reduce_sumrows_partial_f32(float* __restrict__ partial, const float* __restrict__ x, long long n, long long c, long long rowsPerChunk) {
    __shared__ float s[8][33];
    const long long j = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rowsPerChunk;
    const long long r1 = min(n, r0 + rowsPerChunk);
    float acc = 0.0f;
    if (j < c) {
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) acc += x[r * c + j];
    }
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float t = s[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < 8; k++) t += s[k][threadIdx.x];
        partial[(long long)blockIdx.y * c + j] = t;
    }
}

// SumRows, pass 2: out[j] += Σ_chunk partial[chunk, j], chunks in order.
extern "C" __global__ void reduce_sumrows_final_f32(float* __restrict__ out, const float* __restrict__ partial, long long chunks, long long c) {
    GRID_STRIDE(j, c) {
        float t = 0.0f;
        for (long long k = 0; k < chunks; k++) t += partial[k * c + j];
        out[j] += t;
    }
}

// SumAll, pass 1: partial[block] = the float64 sum of the elements the
// block's threads visit (grid-strided).
extern "C" __global__ void reduce_sumall_partial_f32(double* __restrict__ partial, const float* __restrict__ x, long long n) {
    __shared__ double shm[32];
    double acc = 0.0;
    GRID_STRIDE(i, n) { acc += (double)x[i]; }
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// SumAll, pass 2 (one block): out[0] = float32(Σ partial).
extern "C" __global__ void reduce_sumall_final_f32(float* __restrict__ out, const double* __restrict__ partial, int nparts) {
    __shared__ double shm[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0) out[0] = (float)acc;
}

// out[r] = Σ_j x[r, j] in float32, for the n rows of x (n, c).
extern "C" __global__ void reduce_rowsum_f32(float* __restrict__ out, const float* __restrict__ x, long long n, long long c) {
    __shared__ float shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = x + r * c;
        float acc = 0.0f;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) acc += row[j];
        acc = block_sum(acc, shm);
        if (threadIdx.x == 0) out[r] = acc;
    }
}

// m[r] = max_j x[r, j] (-Inf for an empty row).
extern "C" __global__ void reduce_rowmax_f32(float* __restrict__ m, const float* __restrict__ x, long long n, long long c) {
    __shared__ float shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = x + r * c;
        float acc = -INFINITY;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) acc = fmaxf(acc, row[j]);
        acc = block_max(acc, shm);
        if (threadIdx.x == 0) m[r] = acc;
    }
}

// argmax_better says whether candidate (v, i) replaces (bv, bi) as the
// running argmax: the CPU scans j = 1, 2, ... replacing best when
// x[j] > x[best], so the first index of the maximum wins, NaNs never win
// (x[0] being NaN is handled by the caller) and -0 ties with +0.
// bi < 0 means none yet.
__device__ __forceinline__ bool argmax_better(float v, long long i, float bv, long long bi) {
    if (i < 0 || v != v) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

// out[r] = the maximum of row r of x (n, c), arg[r] its first index, as
// the CPU's sequential scan (which keeps index 0 when x[r, 0] is NaN).
extern "C" __global__ void reduce_rowargmax_f32(float* __restrict__ out, int* __restrict__ arg, const float* __restrict__ x, long long n, long long c) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = x + r * c;
        float bv = 0.0f;
        long long bi = -1;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            float v = row[j];
            if (argmax_better(v, j, bv, bi)) {
                bv = v;
                bi = j;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (argmax_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < nwarps ? sv[lane] : 0.0f;
            bi = lane < nwarps ? si[lane] : -1;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (argmax_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            if (lane == 0) {
                if (bi < 0 || row[0] != row[0]) bi = 0;  // all NaN, or x[r, 0] NaN: the CPU keeps 0
                arg[r] = (int)bi;
                out[r] = row[bi];
            }
        }
    }
}

// Softmax of each row of x (n, c) into out (which may alias x):
// exp(x - max) / Σ exp(x - max), the sum in float32.
extern "C" __global__ void reduce_softmax_fwd_f32(float* out, const float* x, long long n, long long c) {
    __shared__ float shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = x + r * c;
        float* o = out + r * c;
        float m = -INFINITY;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, row[j]);
        m = block_max(m, shm);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) s += expf(row[j] - m);
        s = block_sum(s, shm);  // its barriers order every read of x before the writes below
        const float inv = 1.0f / s;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) o[j] = expf(row[j] - m) * inv;
    }
}

// dx += out·(dout - Σ_j dout·out) per row of (n, c).
extern "C" __global__ void reduce_softmax_bwd_f32(float* dx, const float* dout, const float* out, long long n, long long c) {
    __shared__ float shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* g = dout + r * c;
        const float* y = out + r * c;
        float* d = dx + r * c;
        float dot = 0.0f;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) dot += g[j] * y[j];
        dot = block_sum(dot, shm);
        for (long long j = threadIdx.x; j < c; j += blockDim.x) d[j] += y[j] * (g[j] - dot);
    }
}

// LossMaskMean (one block): w[i] = mask[i] (1 when mask is null), and
// out[0] = Σ w·losses / Σ w (0 when Σ w <= 0), both sums in float64;
// den[0] = Σ w for the host.
extern "C" __global__ void __launch_bounds__(1024) reduce_loss_mask_mean_f32(float* __restrict__ out, double* __restrict__ den, float* __restrict__ w, const float* __restrict__ losses, const float* __restrict__ mask, long long n) {
    __shared__ double shm[32];
    double num = 0.0, d = 0.0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        float m = mask ? mask[i] : 1.0f;
        w[i] = m;
        d += (double)m;
        num += (double)losses[i] * (double)m;
    }
    d = block_sum(d, shm);
    num = block_sum(num, shm);
    if (threadIdx.x == 0) {
        out[0] = d > 0.0 ? (float)(num / d) : 0.0f;
        den[0] = d;
    }
}

// LossMaskScale: w *= dout[0] / den (the float32 quotient, as the CPU),
// or w = 0 when positive is 0 (den <= 0).
extern "C" __global__ void reduce_loss_mask_scale_f32(float* __restrict__ w, const float* __restrict__ dout, float den, int positive, long long n) {
    const float q = dout[0] / den;
    GRID_STRIDE(i, n) { w[i] = positive ? w[i] * q : 0.0f; }
}

// LossMaskScale with den read on the device (reduce_loss_mask_mean_f32's
// double), so that the forward reads nothing back: w *= dout[0] /
// (float)den, or w = 0 when den <= 0 — the host path's arithmetic.
extern "C" __global__ void reduce_loss_mask_scale_dev_f32(float* __restrict__ w, const float* __restrict__ dout, const double* __restrict__ den, long long n) {
    const double d = den[0];
    const int positive = d > 0.0;
    const float q = dout[0] / (positive ? (float)d : 1.0f);
    GRID_STRIDE(i, n) { w[i] = positive ? w[i] * q : 0.0f; }
}
