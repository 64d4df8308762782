// Softmax cross-entropy of the CUDA backend (tensor/cuda_backend_xent.go),
// following internal/cpu/crossentropy.go and vocabce.go: the fused
// cross-entropy over whole rows, and one rank's share of the
// vocab-parallel cross-entropy (partials, loss, gradient).
//
// Row kernels run one block per row (rows grid-strided over the blocks);
// blockDim.x is a multiple of 32, at most 1024 (the launch bound), and every thread of a
// block reaches each block reduction (no early return). Sums of
// exponentials are float32 (the CPU's are) in a tree order, and expf is
// CUDA's (within 2 ulp, as the CPU's vector exp), so they match the CPU
// within rounding; elementwise steps round as the CPU does (no fused
// multiply-add where Go computes a product and a sum apart).
//
// A target outside [0, V) that is not the ignore index (the CPU panics on
// one) makes the row's loss NaN and its gradient row NaN: the device
// cannot panic, and checking on the host would read the targets back.

#include <stdint.h>

#define XENT_NAN __int_as_float(0x7fc00000)

template <typename T>
__device__ __forceinline__ T xent_block_sum(T v, T* shm) {
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

// Block-wide maximum (fmaxf: a NaN loses to a number, as the CPU's max).
__device__ __forceinline__ float xent_block_max(float v, float* shm) {
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

// CrossEntropyForward: lse[i] = float32(m + log(Σ exp(x-m))) (the sum in
// float32, the rest in float64), losses[i] = float32((1-s)(l - x[t]) +
// s(l - Σx/V)) with l the float64 log-sum-exp, or 0 for an ignored row
// (ignore != 0 and t == ignore).
extern "C" __global__ void __launch_bounds__(1024) xent_fwd_f32(float* losses, float* lse, const float* logits, const int32_t* targets,
                                        long long n, long long v, float smoothing, int ignore) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* x = logits + r * v;
        float m = -INFINITY;
        for (long long j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, x[j]);
        m = xent_block_max(m, shf);
        float se = 0.0f;
        double sum = 0.0;
        for (long long j = threadIdx.x; j < v; j += blockDim.x) {
            se += expf(__fsub_rn(x[j], m));
            if (smoothing != 0.0f) sum += (double)x[j];
        }
        se = xent_block_sum(se, shf);
        if (smoothing != 0.0f) sum = xent_block_sum(sum, shd);
        if (threadIdx.x == 0) {
            const double l = (double)m + log((double)se);
            lse[r] = (float)l;
            const int32_t t = targets[r];
            float loss;
            if (ignore != 0 && t == ignore) {
                loss = 0.0f;
            } else if (t < 0 || (long long)t >= v) {
                loss = XENT_NAN;
            } else {
                const double s = (double)smoothing;
                double acc = __dmul_rn(1.0 - s, l - (double)x[t]);
                if (smoothing != 0.0f) acc = __dadd_rn(acc, __dmul_rn(s, l - sum / (double)v));
                loss = (float)acc;
            }
            losses[r] = loss;
        }
    }
}

// CrossEntropyBackward overwrites dlogits (which may alias logits):
// dx[j] = g·(exp(x[j] - lse) - s/V), then dx[t] -= g·(1-s); zero rows for
// ignored targets. One thread owns each element (reads x[j], then writes
// dx[j]), so the in-place form is safe.
extern "C" __global__ void __launch_bounds__(1024) xent_bwd_f32(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                        const float* dlosses, long long n, long long v, float smoothing, int ignore) {
    const float u = __fdiv_rn(smoothing, (float)v);
    const float oneMinusS = __fsub_rn(1.0f, smoothing);
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* x = logits + r * v;
        float* dx = dlogits + r * v;
        const int32_t t = targets[r];
        if (ignore != 0 && t == ignore) {
            for (long long j = threadIdx.x; j < v; j += blockDim.x) dx[j] = 0.0f;
            continue;
        }
        const bool bad = t < 0 || (long long)t >= v;
        const float g = dlosses[r], l = lse[r];
        for (long long j = threadIdx.x; j < v; j += blockDim.x) {
            float d = __fmul_rn(g, __fsub_rn(expf(__fsub_rn(x[j], l)), u));
            if (j == (long long)t) d = __fsub_rn(d, __fmul_rn(g, oneMinusS));
            dx[j] = bad ? XENT_NAN : d;
        }
    }
}

// VocabCrossEntropyPartials: partials[i] = Σ_j exp(x[i,j] - rowMax[i])
// (float32), partials[n+i] = x[i, targets[i]-start] - rowMax[i] when the
// target is in this rank's slice [start, start+v), else 0.
extern "C" __global__ void __launch_bounds__(1024) xent_vocab_partials_f32(float* partials, const float* x, const float* rowMax,
                                                   const int32_t* targets, long long n, long long v, long long start) {
    __shared__ float shf[32];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * v;
        const float m = rowMax[r];
        float se = 0.0f;
        for (long long j = threadIdx.x; j < v; j += blockDim.x) se += expf(__fsub_rn(xr[j], m));
        se = xent_block_sum(se, shf);
        if (threadIdx.x == 0) {
            partials[r] = se;
            const long long j = (long long)targets[r] - start;
            partials[n + r] = (j >= 0 && j < v) ? __fsub_rn(xr[j], m) : 0.0f;
        }
    }
}

// VocabCrossEntropyLoss, pass 1 (elementwise over rows): s = log(float64
// partials[i]), lse[i] = float32(rowMax[i] + s), term[i] = (s -
// partials[n+i])·w_i in float64, w_i = mask[i] or 1 (mask null).
extern "C" __global__ void xent_vocab_loss_rows_f32(double* term, float* lse, const float* partials,
                                                    const float* rowMax, const float* mask, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double w = mask != nullptr ? (double)mask[i] : 1.0;
        const double s = log((double)partials[i]);
        lse[i] = (float)__dadd_rn((double)rowMax[i], s);
        term[i] = __dmul_rn(__dsub_rn(s, (double)partials[n + i]), w);
    }
}

// VocabCrossEntropyLoss, pass 2 (one block of 256 threads; float64 sums
// in row order, as the CPU): loss[0] = float32(Σ term / Σ w), or 0 when
// Σ w is not positive; den[0] = Σ w. The block stages tiles of the terms
// and weights in shared memory, and thread 0 adds each tile in order.
extern "C" __global__ void __launch_bounds__(256) xent_vocab_loss_final_f32(float* loss, double* den, const double* term,
                                                                          const float* mask, long long n) {
    __shared__ double tt[1024];
    __shared__ float tw[1024];
    double num = 0.0, d = 0.0;
    for (long long base = 0; base < n; base += 1024) {
        const int m = (int)min(1024LL, n - base);
        for (int i = threadIdx.x; i < m; i += blockDim.x) {
            tt[i] = term[base + i];
            tw[i] = mask != nullptr ? mask[base + i] : 1.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < m; i++) {
                num = __dadd_rn(num, tt[i]);
                d = __dadd_rn(d, (double)tw[i]);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        loss[0] = d > 0.0 ? (float)(num / d) : 0.0f;
        den[0] = d;
    }
}

// VocabCrossEntropyBackward overwrites dx (which may alias x):
// dx[i,j] = scale_i·exp(x[i,j] - lse[i]), minus scale_i at the target's
// column when it is in this slice; scale_i = float32(dloss[0]·w_i)/den
// (den the float32 of Σ w), or 0 for every row when positive is 0.
extern "C" __global__ void __launch_bounds__(1024) xent_vocab_bwd_f32(float* dx, const float* x, const float* lse, const int32_t* targets,
                                              const float* mask, const float* dloss, long long n, long long v,
                                              long long start, float den, int positive) {
    const float gl = dloss[0];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * v;
        float* d = dx + r * v;
        float scale = 0.0f;
        if (positive) scale = __fdiv_rn(__fmul_rn(gl, mask != nullptr ? mask[r] : 1.0f), den);
        const float l = lse[r];
        const long long t = (long long)targets[r] - start;
        for (long long j = threadIdx.x; j < v; j += blockDim.x) {
            float y = __fmul_rn(expf(__fsub_rn(xr[j], l)), scale);
            if (j == t) y = __fsub_rn(y, scale);
            d[j] = y;
        }
    }
}

// xent_vocab_bwd_f32's rows, for xent_vocab_bwd_dev_f32 (the verified
// kernel above keeps its own body).
__device__ __forceinline__ void xent_vocab_bwd_rows(float* dx, const float* x, const float* lse, const int32_t* targets,
                                                    const float* mask, const float* dloss, long long n, long long v,
                                                    long long start, float den, int positive) {
    const float gl = dloss[0];
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * v;
        float* d = dx + r * v;
        float scale = 0.0f;
        if (positive) scale = __fdiv_rn(__fmul_rn(gl, mask != nullptr ? mask[r] : 1.0f), den);
        const float l = lse[r];
        const long long t = (long long)targets[r] - start;
        for (long long j = threadIdx.x; j < v; j += blockDim.x) {
            float y = __fmul_rn(expf(__fsub_rn(xr[j], l)), scale);
            if (j == t) y = __fsub_rn(y, scale);
            d[j] = y;
        }
    }
}

// xent_vocab_bwd_f32 with Σ mask read on the device (xent_vocab_loss_final_f32's
// double), so that the forward reads nothing back: the same arithmetic as the
// host path's float32 den and positive flag.
extern "C" __global__ void __launch_bounds__(1024) xent_vocab_bwd_dev_f32(float* dx, const float* x, const float* lse,
                                                  const int32_t* targets, const float* mask, const float* dloss,
                                                  long long n, long long v, long long start, const double* den) {
    const double dd = den[0];
    const int positive = dd > 0.0;
    xent_vocab_bwd_rows(dx, x, lse, targets, mask, dloss, n, v, start, positive ? (float)dd : 1.0f, positive);
}
