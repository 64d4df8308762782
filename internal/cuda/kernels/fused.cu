// Fused elementwise kernels of the CUDA backend (tensor/cuda_backend_fused.go):
// Megatron's bias-GELU, bias-SwiGLU and bias-dropout-add fusions, each the
// chain of elem.cu and dropout.cu kernels it replaces in one pass over
// memory, operation for operation (the bias added in float32 first, as
// elem_add_f32 adds it). Element counts are 64-bit; loops are grid-stride;
// b is a bias (c) over the rows of y (n, c).

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// div_fast is elem.cu's: i / n in 32 bits when both fit.
__device__ __forceinline__ long long div_fast(long long i, long long n) {
    if (((unsigned long long)i | (unsigned long long)n) <= 0xFFFFFFFFull) {
        return (long long)((unsigned int)i / (unsigned int)n);
    }
    return i / n;
}

// sigmoid_f32 and the GELU constants are elem.cu's.
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
#define GELU_TANH_K 0.7978845608028654f
#define GELU_TANH_2K 1.5957691216057308f

// biased is y[i] + b[i mod c].
__device__ __forceinline__ float biased(const float* y, const float* b, long long i, long long c) {
    return y[i] + b[i - div_fast(i, c) * c];
}

// out = GELU_tanh(y + b): elem_add_f32 then elem_gelu_tanh_fwd_f32.
extern "C" __global__ void fused_bias_gelu_tanh_fwd_f32(float* out, const float* y, const float* b, long long n, long long c) {
    GRID_STRIDE(i, n) {
        float v = biased(y, b, i, c);
        float s = sigmoid_f32(GELU_TANH_2K * (v + 0.044715f * v * v * v));
        out[i] = v * s;
    }
}

// dy += dout·GELU_tanh'(y + b).
extern "C" __global__ void fused_bias_gelu_tanh_bwd_f32(float* dy, const float* dout, const float* y, const float* b, long long n, long long c) {
    GRID_STRIDE(i, n) {
        float v = biased(y, b, i, c);
        float s = sigmoid_f32(GELU_TANH_2K * (v + 0.044715f * v * v * v));
        dy[i] += dout[i] * (s + 2.0f * v * s * (1.0f - s) * GELU_TANH_K * (1.0f + 0.134145f * v * v));
    }
}

// out = GELU_erf(y + b), the GELU in float64 as elem_gelu_erf_fwd_f32.
extern "C" __global__ void fused_bias_gelu_erf_fwd_f32(float* out, const float* y, const float* b, long long n, long long c) {
    GRID_STRIDE(i, n) {
        double v = (double)biased(y, b, i, c);
        out[i] = (float)(0.5 * v * (1.0 + erf(v / 1.4142135623730951)));
    }
}

// dy += dout·GELU_erf'(y + b).
extern "C" __global__ void fused_bias_gelu_erf_bwd_f32(float* dy, const float* dout, const float* y, const float* b, long long n, long long c) {
    GRID_STRIDE(i, n) {
        double v = (double)biased(y, b, i, c);
        double g = 0.5 * (1.0 + erf(v / 1.4142135623730951)) + v * 0.3989422804014327 * exp(-0.5 * v * v);
        dy[i] += dout[i] * (float)g;
    }
}

// out (rows, f) = silu(gate + b_gate)·(up + b_up) for y (rows, 2f) rows
// [gate | up] and b (2f): elem_add_f32 then elem_swiglu_fwd_f32. n = rows·f.
extern "C" __global__ void fused_bias_swiglu_fwd_f32(float* out, const float* y, const float* b, long long n, long long f) {
    GRID_STRIDE(i, n) {
        long long r = div_fast(i, f), j = i - r * f;
        float g = y[r * 2 * f + j] + b[j], u = y[r * 2 * f + f + j] + b[f + j];
        out[i] = g * sigmoid_f32(g) * u;
    }
}

// dgate += dout·up·silu'(gate), dup += dout·silu(gate) at y + b, into dy
// (rows, 2f).
extern "C" __global__ void fused_bias_swiglu_bwd_f32(float* dy, const float* dout, const float* y, const float* b, long long n, long long f) {
    GRID_STRIDE(i, n) {
        long long r = div_fast(i, f), j = i - r * f;
        long long gi = r * 2 * f + j, ui = gi + f;
        float g = y[gi] + b[j], u = y[ui] + b[f + j], d = dout[i];
        float s = sigmoid_f32(g);
        dy[gi] += d * u * s * (1.0f + g * (1.0f - s));
        dy[ui] += d * g * s;
    }
}

// philox4x32_10 is dropout.cu's (tensor.philox).
__device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * ctr.x;
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr.z;
        ctr = make_uint4((uint32_t)(p1 >> 32) ^ ctr.y ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ ctr.w ^ k1, (uint32_t)p0);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return ctr;
}

// out = residual + (y + b)·mask for one Philox block per thread (elements
// 4q..4q+3): the mask of dropout_mask_f32 (0 where the word is below thr,
// else keep), never stored. b may be null (no bias); dropout 0 means no
// mask. The product is rounded before the add (__fmul_rn), as elem_mul_f32
// then elem_add_f32 round it.
extern "C" __global__ void fused_bias_dropout_add_f32(float* out, const float* residual, const float* y, const float* b, long long n, long long c,
                                                       int dropout, unsigned int k0, unsigned int k1, unsigned long long offset, unsigned int thr, float keep) {
    const long long blocks = (n + 3) / 4;
    GRID_STRIDE(q, blocks) {
        uint32_t words[4] = {0u, 0u, 0u, 0u};
        if (dropout) {
            const unsigned long long k = offset + (unsigned long long)q;
            const uint4 w = philox4x32_10(make_uint4((uint32_t)k, (uint32_t)(k >> 32), 0u, 0u), k0, k1);
            words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long long i = 4 * q + j;
            if (i < n) {
                float v = b ? biased(y, b, i, c) : y[i];
                if (dropout) v = __fmul_rn(v, words[j] < thr ? 0.0f : keep);
                out[i] = residual[i] + v;
            }
        }
    }
}

// dy += dout·mask, the mask of fused_bias_dropout_add_f32 drawn again.
extern "C" __global__ void fused_dropout_bwd_f32(float* dy, const float* dout, long long n, unsigned int k0, unsigned int k1, unsigned long long offset,
                                                  unsigned int thr, float keep) {
    const long long blocks = (n + 3) / 4;
    GRID_STRIDE(q, blocks) {
        const unsigned long long k = offset + (unsigned long long)q;
        const uint4 w = philox4x32_10(make_uint4((uint32_t)k, (uint32_t)(k >> 32), 0u, 0u), k0, k1);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long long i = 4 * q + j;
            if (i < n) dy[i] += __fmul_rn(dout[i], words[j] < thr ? 0.0f : keep);
        }
    }
}

// fused_block_sum is norm.cu's norm_block_sum: the block-wide sum of v,
// returned to every thread; shm holds 32 values, the leading barrier lets a
// loop reuse it (and publishes what the block wrote to shared memory before
// the call).
__device__ __forceinline__ double fused_block_sum(double v, double* shm) {
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

// sum = residual + (y + b)·mask as fused_bias_dropout_add_f32, then out =
// the norm of sum's rows as norm.cu's norm_layernorm_fwd_f32 (w, nb; nb may
// be null) or, when mean is null, norm_rmsnorm_fwd_f32 (w): one block per
// row (rows grid-strided over the blocks), residual and y read once, sum and
// out written once, the row kept in dynamic shared memory (c floats) for
// the statistics (float64 block sums, as norm.cu) and the output. Threads
// take the row's Philox blocks (4 elements each; a block that straddles two
// rows is drawn by both). blockDim.x is a multiple of 32, at most 256, and
// every thread reaches each block reduction.
extern "C" __global__ void __launch_bounds__(256) fused_bias_dropout_add_norm_f32(
    float* sum, float* out, float* mean, float* rstd, const float* residual, const float* y, const float* b, const float* w,
    const float* nb, long long n, long long c, int dropout, unsigned int k0, unsigned int k1, unsigned long long offset,
    unsigned int thr, float keep, float eps) {
#ifdef FUSED_HOST_ROW
    float* row = fh_row.data(); // testdata/fused_host.cc
#else
    extern __shared__ float row[];
#endif
    __shared__ double shm[32];
    const bool rms = mean == nullptr;
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const long long i0 = r * c, i1 = i0 + c;
        double s = 0.0;
        for (long long q = i0 / 4 + threadIdx.x; 4 * q < i1; q += blockDim.x) {
            uint32_t words[4] = {0u, 0u, 0u, 0u};
            if (dropout) {
                const unsigned long long k = offset + (unsigned long long)q;
                const uint4 wd = philox4x32_10(make_uint4((uint32_t)k, (uint32_t)(k >> 32), 0u, 0u), k0, k1);
                words[0] = wd.x, words[1] = wd.y, words[2] = wd.z, words[3] = wd.w;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const long long i = 4 * q + j;
                if (i >= i0 && i < i1) {
                    float v = b ? __fadd_rn(y[i], b[i - i0]) : y[i];
                    if (dropout) v = __fmul_rn(v, words[j] < thr ? 0.0f : keep);
                    const float t = __fadd_rn(residual[i], v);
                    sum[i] = t;
                    row[i - i0] = t;
                    s += rms ? (double)t * (double)t : (double)t;
                }
            }
        }
        s = fused_block_sum(s, shm);
        float m = 0.0f, rs;
        if (rms) {
            rs = (float)(1.0 / sqrt(s / (double)c + (double)eps));
        } else {
            m = (float)(s / (double)c);
            double v2 = 0.0;
            for (long long j = threadIdx.x; j < c; j += blockDim.x) {
                const double d = (double)__fsub_rn(row[j], m);
                v2 += d * d;
            }
            v2 = fused_block_sum(v2, shm);
            rs = (float)(1.0 / sqrt(v2 / (double)c + (double)eps));
        }
        float* o = out + i0;
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
            float v;
            if (rms) {
                v = __fmul_rn(__fmul_rn(row[j], rs), w[j]);
            } else {
                v = __fmul_rn(__fmul_rn(__fsub_rn(row[j], m), rs), w[j]);
                if (nb != nullptr) v = __fadd_rn(v, nb[j]);
            }
            o[j] = v;
        }
        if (threadIdx.x == 0) {
            if (!rms) mean[r] = m;
            rstd[r] = rs;
        }
        __syncthreads(); // the next row overwrites row[]
    }
}
