// LayerNorm and RMSNorm of the CUDA backend (tensor/cuda_backend_norm.go),
// following internal/cpu/norm.go: row statistics and the backward's row
// dot products accumulate in float64 (in a tree order, so they match the
// CPU's sequential sums within rounding), and each elementwise step is
// rounded as the CPU rounds it (__fmul_rn and friends: no fused
// multiply-add where Go computes a product and a sum apart).
//
// Row kernels run one block per row (rows grid-strided over the blocks);
// blockDim.x is a multiple of 32, at most 256 (the launch bound), and every thread of a
// block reaches each block reduction (no early return).
//
// The weight and bias gradients are reduced over rows without atomics, in
// two passes that do not depend on scheduling: each chunk of rows sums its
// column terms into a (chunks, c) scratch in float32, then the chunks are
// added in order into dw/db (+=, as the CPU accumulates).

#include <stdint.h>

// Block-wide sum of v, returned to every thread. shm holds 32 values; the
// leading barrier lets a loop reuse it.
__device__ __forceinline__ double norm_block_sum(double v, double* shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? shm[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) shm[0] = v;
    }
    __syncthreads();
    return shm[0];
}

// norm_bf16_from_f32 rounds to bfloat16 as elem.cu's bf16_from_f32 (internal/half's
// conversion bit for bit: NaN quieted, ties to even).
__device__ __forceinline__ uint16_t norm_bf16_from_f32(float f) {
    uint32_t b = __float_as_uint(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x0040u);
    b += 0x7FFFu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

// LayerNormForward: out[i,j] = (x[i,j]-mean[i])*rstd[i]*w[j] (+ b[j]) with
// mean = float32(Σx/c), rstd = float32(1/sqrt(Σ float64(x-mean)²/c + eps));
// b may be null. With BF16 the output is also written rounded to bfloat16
// into out16: the operand of the linear layer it feeds (gemm-bf16).
template <bool BF16>
__device__ __forceinline__ void norm_layernorm_fwd(float* out, uint16_t* out16, float* mean, float* rstd, const float* x,
                                                   const float* w, const float* b, long long n, long long c, float eps) {
    __shared__ double shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * c;
        float* o = out + r * c;
        double s = 0.0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) s += (double)xr[j];
        s = norm_block_sum(s, shm);
        const float m = (float)(s / (double)c);
        double v2 = 0.0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const double d = (double)__fsub_rn(xr[j], m);
            v2 += d * d;
        }
        v2 = norm_block_sum(v2, shm);
        const float rs = (float)(1.0 / sqrt(v2 / (double)c + (double)eps));
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            float y = __fmul_rn(__fmul_rn(__fsub_rn(xr[j], m), rs), w[j]);
            if (b != nullptr) y = __fadd_rn(y, b[j]);
            o[j] = y;
            if (BF16) out16[r * c + j] = norm_bf16_from_f32(y);
        }
        if (threadIdx.x == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) norm_layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* x,
                                                  const float* w, const float* b, long long n, long long c, float eps) {
    norm_layernorm_fwd<false>(out, nullptr, mean, rstd, x, w, b, n, c, eps);
}

extern "C" __global__ void __launch_bounds__(256) norm_layernorm_fwd_f32_bf16(float* out, uint16_t* out16, float* mean, float* rstd,
                                                       const float* x, const float* w, const float* b, long long n, long long c,
                                                       float eps) {
    norm_layernorm_fwd<true>(out, out16, mean, rstd, x, w, b, n, c, eps);
}

// LayerNormBackward, the input gradient:
// dx += (w*g - dmean - xhat*dnormMean)*rstd, dmean = float32(Σ float64(w*g)/c),
// dnormMean = float32(Σ float64(w*g*(x-mean))/c * rstd), xhat = (x-mean)*rstd.
extern "C" __global__ void __launch_bounds__(256) norm_layernorm_bwd_dx_f32(float* dx, const float* dout, const float* x, const float* w,
                                                     const float* mean, const float* rstd, long long n, long long c) {
    __shared__ double shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * c;
        const float* g = dout + r * c;
        float* d = dx + r * c;
        const float m = mean[r], rs = rstd[r];
        double sm = 0.0, snm = 0.0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const float wg = __fmul_rn(w[j], g[j]);
            sm += (double)wg;
            snm += (double)__fmul_rn(wg, __fsub_rn(xr[j], m));
        }
        sm = norm_block_sum(sm, shm);
        snm = norm_block_sum(snm, shm);
        const float dmean = (float)(sm / (double)c);
        const float dnormMean = (float)(snm / (double)c * (double)rs);
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const float xh = __fmul_rn(__fsub_rn(xr[j], m), rs);
            const float t = __fsub_rn(__fsub_rn(__fmul_rn(w[j], g[j]), dmean), __fmul_rn(xh, dnormMean));
            d[j] = __fadd_rn(d[j], __fmul_rn(t, rs));
        }
    }
}

// RMSNormForward: out[i,j] = x[i,j]*rstd[i]*w[j],
// rstd = float32(1/sqrt(Σ float64(x)²/c + eps)); with BF16 also out16, as
// LayerNormForward's.
template <bool BF16>
__device__ __forceinline__ void norm_rmsnorm_fwd(float* out, uint16_t* out16, float* rstd, const float* x, const float* w,
                                                 long long n, long long c, float eps) {
    __shared__ double shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * c;
        float* o = out + r * c;
        double s = 0.0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const double v = (double)xr[j];
            s += v * v;
        }
        s = norm_block_sum(s, shm);
        const float rs = (float)(1.0 / sqrt(s / (double)c + (double)eps));
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const float y = __fmul_rn(__fmul_rn(xr[j], rs), w[j]);
            o[j] = y;
            if (BF16) out16[r * c + j] = norm_bf16_from_f32(y);
        }
        if (threadIdx.x == 0) rstd[r] = rs;
    }
}

extern "C" __global__ void __launch_bounds__(256) norm_rmsnorm_fwd_f32(float* out, float* rstd, const float* x, const float* w,
                                                long long n, long long c, float eps) {
    norm_rmsnorm_fwd<false>(out, nullptr, rstd, x, w, n, c, eps);
}

extern "C" __global__ void __launch_bounds__(256) norm_rmsnorm_fwd_f32_bf16(float* out, uint16_t* out16, float* rstd, const float* x,
                                                     const float* w, long long n, long long c, float eps) {
    norm_rmsnorm_fwd<true>(out, out16, rstd, x, w, n, c, eps);
}

// RMSNormBackward, the input gradient: dx += rstd*(w*g - x*k) with
// k = float32(rstd·rstd·Σ float64(w*g*x)/c), products in float64 as the CPU.
extern "C" __global__ void __launch_bounds__(256) norm_rmsnorm_bwd_dx_f32(float* dx, const float* dout, const float* x, const float* w,
                                                   const float* rstd, long long n, long long c) {
    __shared__ double shm[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * c;
        const float* g = dout + r * c;
        float* d = dx + r * c;
        const float rs = rstd[r];
        double dot = 0.0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) dot += (double)__fmul_rn(__fmul_rn(w[j], g[j]), xr[j]);
        dot = norm_block_sum(dot, shm);
        const float k = (float)(__dmul_rn((double)rs, (double)rs) * dot / (double)c);
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            const float t = __fsub_rn(__fmul_rn(w[j], g[j]), __fmul_rn(xr[j], k));
            d[j] = __fadd_rn(d[j], __fmul_rn(rs, t));
        }
    }
}

// Parameter gradients, pass 1: for the chunk of rows
// [chunk·rowsPerChunk, +rowsPerChunk),
//   pw[chunk, j] = Σ g[r,j]*(x[r,j]-mean[r])*rstd[r]   (mean null: RMSNorm, x*rstd)
//   pb[chunk, j] = Σ g[r,j]                             (pb null: no bias)
// in float32. Blocks of 32×8 threads: x columns, y rows (strided by 8),
// then the 8 row sums added in order.
extern "C" __global__ void __launch_bounds__(256) norm_paramgrad_partial_f32(float* pw, float* pb, const float* dout, const float* x,
                                                      const float* mean, const float* rstd, long long n, long long c,
                                                      long long rowsPerChunk) {
    __shared__ float sw[8][33];
    __shared__ float sb[8][33];
    const long long j = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rowsPerChunk;
    const long long r1 = min(n, r0 + rowsPerChunk);
    float aw = 0.0f, ab = 0.0f;
    if (j < c) {
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            const float g = dout[r * c + j];
            const float m = mean != nullptr ? mean[r] : 0.0f;
            aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(g, __fsub_rn(x[r * c + j], m)), rstd[r]));
            ab = __fadd_rn(ab, g);
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float tw = sw[0][threadIdx.x], tb = sb[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < 8; k++) {
            tw = __fadd_rn(tw, sw[k][threadIdx.x]);
            tb = __fadd_rn(tb, sb[k][threadIdx.x]);
        }
        pw[(long long)blockIdx.y * c + j] = tw;
        if (pb != nullptr) pb[(long long)blockIdx.y * c + j] = tb;
    }
}

// Parameter gradients, pass 2: out[j] += Σ_chunk partial[chunk, j], chunks
// in order.
extern "C" __global__ void __launch_bounds__(256) norm_paramgrad_final_f32(float* out, const float* partial, long long chunks, long long c) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < c; j += (long long)gridDim.x * blockDim.x) {
        float t = 0.0f;
        for (long long k = 0; k < chunks; k++) t = __fadd_rn(t, partial[k * c + j]);
        out[j] = __fadd_rn(out[j], t);
    }
}
