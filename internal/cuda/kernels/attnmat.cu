// Materialized attention's row kernels: the CUDA backend's second attention
// path (tensor/cuda_backend_attnmat.go), for calls whose (B, HQ, T, T)
// float32 scores fit a memory budget. cuBLAS computes S = scale·Q·Kᵀ and the
// products with V, dO, K, Q; these kernels do the row-wise work between them
// on S laid out (bc, HQ, T, T) for batch rows b0 .. b0+bc-1 of the call
// (row r = (bl·HQ + h)·T + i, bl = b - b0).
//
// Block attention (context parallelism): qpos and kpos are the sequence
// positions of query row 0 and key row 0, so the causal mask is
// j + kpos > i + qpos and the dropout masks are keyed by positions; with
// accumulate the forward merges this call's keys into the partial result
// (normalised out, lse over other keys, -Inf where none) already in out and
// lse, as internal/cpu's online softmax does: lse' = log(e^lse + e^lse_new),
// the old out row scaled by e^(lse - lse') here and the probabilities
// exp(s - lse') multiplied onto V by the caller with beta 1.
//
// Semantics are internal/cpu's and attn.cu's: masked scores (causal j > i,
// another document) are excluded; a row with no allowed key gets lse -Inf
// and probabilities 0; lse is the log-sum-exp before dropout; dropout
// multiplies the probabilities by 0 or 1/(1-p) with the keyed splitmix64
// masks of internal/cpu/attention_dropout.go. attnmat_mix64, attnmat_row_key
// and attnmat_keep are attn.cu's attn_mix64, attn_row_key and attn_keep
// verbatim (the families compile one by one, so they cannot share a header):
// the masks are bit for bit those of the flash kernels and the CPU.

#include <stdint.h>

#define ATTNMAT_FULL 0xffffffffu
#define ATTNMAT_GOLDEN 0x9E3779B97F4A7C15ull
#define ATTNMAT_THREADS 256

__device__ __forceinline__ uint64_t attnmat_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t attnmat_row_key(uint64_t seed, int b, int head, int i) {
    uint64_t k = attnmat_mix64(seed + (uint64_t)(b + 1) * ATTNMAT_GOLDEN);
    k = attnmat_mix64(k + (uint64_t)(head + 1) * ATTNMAT_GOLDEN);
    return attnmat_mix64(k + (uint64_t)(i + 1) * ATTNMAT_GOLDEN);
}

__device__ __forceinline__ float attnmat_keep(uint64_t rowKey, int j, uint32_t thr, float dscale) {
    uint64_t x = attnmat_mix64(rowKey + (uint64_t)(j >> 1) * ATTNMAT_GOLDEN);
    uint32_t bits = (j & 1) ? (uint32_t)(x >> 32) : (uint32_t)x;
    return bits >= thr ? dscale : 0.0f;
}

// attnmat_block_max and attnmat_block_sum reduce over the block (blockDim.x
// a multiple of 32, at most 1024); every thread gets the result. red holds
// 32 floats; the leading __syncthreads lets a caller reuse it.
__device__ __forceinline__ float attnmat_block_max(float x, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATTNMAT_FULL, x, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < nw ? red[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATTNMAT_FULL, x, o));
    return x;
}

__device__ __forceinline__ float attnmat_block_sum(float x, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATTNMAT_FULL, x, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < nw ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATTNMAT_FULL, x, o);
    return x;
}

// attnmat_allowed is internal/cpu.attnAllowed for in-range i, j, with i
// shifted by qpos - kpos under block attention.
__device__ __forceinline__ bool attnmat_allowed(int causal, int i, int j, int docI, int docJ) {
    return !(causal && j > i) && docI == docJ;
}

// attnmat_fwd_f32: one block per row r of s (rows = bc·HQ·T, grid-stride):
// s holds the scaled scores; writes lse[(b·HQ + h)·T + i] and overwrites the
// row with the probabilities exp(s - lse) (0 where masked), times the
// dropout multiplier when dropout is set. With accumulate it merges into
// lse and rescales (or, where lse was -Inf, zeroes) the row's D values of
// out, (B, T, HQ, D), for the caller's P̃·V product with beta 1.
extern "C" __global__ void attnmat_fwd_f32(float* s, float* lse, float* out, const int32_t* docs, long long rows, int T,
                                           int HQ, int D, int b0, int causal, int dropout, uint32_t thr, float dscale,
                                           uint64_t seed, int firstHead, int qpos, int kpos, int accumulate) {
    __shared__ float red[32];
    const int off = qpos - kpos; // key j is at or before query i iff j <= i + off
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const int i = (int)(r % T);
        const long long bh = r / T;
        const int h = (int)(bh % HQ);
        const int b = b0 + (int)(bh / HQ);
        float* row = s + r * T;
        const int32_t* db = docs != nullptr ? docs + (long long)b * T : nullptr;
        const int docI = db != nullptr ? db[i] : 0;
        const int jEnd = causal ? max(0, min(T, i + off + 1)) : T;
        float* lp = lse + ((long long)b * HQ + h) * T + i;
        const float old = accumulate ? *lp : -INFINITY; // read before thread 0 writes (the reductions sync)

        float m = -INFINITY;
        for (int j = threadIdx.x; j < jEnd; j += blockDim.x)
            if (db == nullptr || db[j] == docI) m = fmaxf(m, row[j]);
        m = attnmat_block_max(m, red);
        float l = 0.0f;
        if (m != -INFINITY)
            for (int j = threadIdx.x; j < jEnd; j += blockDim.x)
                if (db == nullptr || db[j] == docI) l += expf(row[j] - m);
        l = attnmat_block_sum(l, red);
        float ls = m == -INFINITY ? -INFINITY : m + logf(l);
        if (accumulate) {
            float alpha = 0.0f; // the old row's weight; 0: the row had no keys (overwrite, as the CPU clears it)
            if (old != -INFINITY) {
                if (ls != -INFINITY) {
                    const float mx = fmaxf(old, ls);
                    ls = mx + logf(expf(old - mx) + expf(ls - mx));
                } else {
                    ls = old;
                }
                alpha = expf(old - ls);
            }
            float* orow = out + (((long long)b * T + i) * HQ + h) * D;
            for (int d = threadIdx.x; d < D; d += blockDim.x) orow[d] = alpha == 0.0f ? 0.0f : orow[d] * alpha;
        }
        if (threadIdx.x == 0) *lp = ls;
        const uint64_t key = dropout ? attnmat_row_key(seed, b, firstHead + h, i + qpos) : 0;
        for (int j = threadIdx.x; j < T; j += blockDim.x) {
            float p = 0.0f;
            if (ls != -INFINITY && attnmat_allowed(causal, i + off, j, docI, db != nullptr ? db[j] : 0)) {
                p = expf(row[j] - ls);
                if (dropout) p *= attnmat_keep(key, j + kpos, thr, dscale);
            }
            row[j] = p;
        }
    }
}

// attnmat_bwd_f32: one block per row r (as attnmat_fwd_f32). s holds the
// scaled scores, dp = dO·Vᵀ (the gradient of the dropped probabilities).
// With P = exp(s - lse) (0 where masked or lse is -Inf), Z the dropout
// multiplier (1 without dropout) and delta = dout_i·out_i, it overwrites dp
// with dS = P·(Z·dP - delta)·scale and s with P·Z (internal/cpu's
// attnBackwardTile). qpos and kpos are the forward's block positions; lse
// and out are the merged results, so the backward needs no accumulate.
extern "C" __global__ void attnmat_bwd_f32(float* s, float* dp, const float* lse, const float* dout, const float* out,
                                           const int32_t* docs, long long rows, int T, int HQ, int D, int b0,
                                           float scale, int causal, int dropout, uint32_t thr, float dscale,
                                           uint64_t seed, int firstHead, int qpos, int kpos) {
    __shared__ float red[32];
    const int off = qpos - kpos;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const int i = (int)(r % T);
        const long long bh = r / T;
        const int h = (int)(bh % HQ);
        const int b = b0 + (int)(bh / HQ);
        float* srow = s + r * T;
        float* dprow = dp + r * T;
        const int32_t* db = docs != nullptr ? docs + (long long)b * T : nullptr;
        const int docI = db != nullptr ? db[i] : 0;
        const long long o = (((long long)b * T + i) * HQ + h) * D;
        float delta = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) delta += dout[o + d] * out[o + d];
        delta = attnmat_block_sum(delta, red);
        const float li = lse[((long long)b * HQ + h) * T + i];
        const uint64_t key = dropout ? attnmat_row_key(seed, b, firstHead + h, i + qpos) : 0;
        for (int j = threadIdx.x; j < T; j += blockDim.x) {
            float p = 0.0f, ds = 0.0f;
            if (li != -INFINITY && attnmat_allowed(causal, i + off, j, docI, db != nullptr ? db[j] : 0)) {
                p = expf(srow[j] - li);
                const float z = dropout ? attnmat_keep(key, j + kpos, thr, dscale) : 1.0f;
                ds = p * (z * dprow[j] - delta) * scale;
                p *= z;
            }
            srow[j] = p;
            dprow[j] = ds;
        }
    }
}
