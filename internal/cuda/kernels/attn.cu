// Fused scaled-dot-product attention (flash-attention style), float32 on
// CUDA cores: the CUDA backend's AttentionForward and AttentionBackward.
//
// Layouts (row-major, contiguous), as internal/cpu.AttentionConfig:
// q, out, dq, dout (B, T, HQ, D); k, v, dk, dv (B, T, HKV, D); lse and the
// backward's delta (B, HQ, T); docs int32 (B, T) or null. Query head h reads
// KV head h / (HQ / HKV).
//
// Semantics follow internal/cpu/attention*.go exactly: scores are
// scale·(q·k); masked scores (causal j > i, other document) are -Inf; a row
// with no allowed key gets out 0 and lse -Inf; lse is the log-sum-exp before
// dropout; dropout multiplies the normalised probabilities by 0 or 1/(1-p)
// with the keyed splitmix64 masks of internal/cpu/attention_dropout.go
// (attnKeep), bit for bit the same masks.
//
// Schedule: every kernel gives each warp a few rows of one side (queries or
// keys) and the 32 lanes the 32 entries of the other side, so scores live
// one per lane and no T×T buffer exists. The lanes' side sits transposed in
// shared memory and each lane starts its dot product at its own column
// (conflict-free when the padded head dimension is a multiple of 32); the
// probabilities and dS pass through shared memory to the products with v,
// k, q, dout, read as float4 broadcasts. Tiles sit in
// static shared memory sized for the head dimension bound DMAX (64 or 128;
// two instantiations, with fewer rows per warp at 128), at most 48 KiB, so
// no launch attribute is needed. The backward is two kernels with no
// atomics (deterministic): dq over query tiles, dk and dv over key tiles,
// each recomputing the probabilities from lse; delta_i = dout_i·out_i is a
// third, small kernel before them.
//
// Summation order differs from the CPU's (float32 rounding), so results agree
// with the CPU backend within float tolerance, not bit for bit.

#include <stdint.h>

#define ATTN_FULL 0xffffffffu
#define ATTN_GOLDEN 0x9E3779B97F4A7C15ull

// attn_mix64 is splitmix64's output function (internal/cpu.mix64).
__device__ __forceinline__ uint64_t attn_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// attn_row_key is internal/cpu.attnRowKey: the dropout key of query row i
// of global head head in batch row b.
__device__ __forceinline__ uint64_t attn_row_key(uint64_t seed, int b, int head, int i) {
    uint64_t k = attn_mix64(seed + (uint64_t)(b + 1) * ATTN_GOLDEN);
    k = attn_mix64(k + (uint64_t)(head + 1) * ATTN_GOLDEN);
    return attn_mix64(k + (uint64_t)(i + 1) * ATTN_GOLDEN);
}

// attn_keep is the dropout multiplier of key j in the row keyed rowKey:
// 0 when the key's 32-bit hash is below thr, else dscale (attnKeep: pair
// j/2's 64-bit hash, low half for even j, high half for odd j).
__device__ __forceinline__ float attn_keep(uint64_t rowKey, int j, uint32_t thr, float dscale) {
    uint64_t x = attn_mix64(rowKey + (uint64_t)(j >> 1) * ATTN_GOLDEN);
    uint32_t bits = (j & 1) ? (uint32_t)(x >> 32) : (uint32_t)x;
    return bits >= thr ? dscale : 0.0f;
}

__device__ __forceinline__ float attn_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATTN_FULL, x, o));
    return x;
}

__device__ __forceinline__ float attn_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATTN_FULL, x, o);
    return x;
}

// attn_allowed is internal/cpu.attnAllowed for in-range i, j.
__device__ __forceinline__ bool attn_allowed(int causal, int i, int j, int docI, int docJ) {
    return !(causal && j > i) && docI == docJ;
}

// Tile shapes. Forward: 4 warps × 8 (D <= 64) or 4 (D <= 128) query rows
// per block, 32 keys per tile (one per lane). Backward dq: 4 warps × 4
// (D <= 64) or 3 (D <= 128) query rows, 32 keys per tile. Backward dk/dv:
// 4 warps × 4 or 3 keys, 32 queries per tile (one per lane).
#define ATTN_THREADS 128
#define ATTN_BK 32
#define ATTN_DKV_BQ 32

// load_rows copies rows [r0, r0+n) (n <= cap) of a (rows of stride ld, D
// used floats) into the compact (cap, D) tile s, zeros past nValid rows.
__device__ __forceinline__ void attn_load_rows(float* s, const float* a, long long ld, int r0, int nValid, int cap, int D) {
    for (int idx = threadIdx.x; idx < cap * D; idx += blockDim.x) {
        int r = idx / D, d = idx - r * D;
        s[idx] = r < nValid ? a[(long long)(r0 + r) * ld + d] : 0.0f;
    }
}

// attn_fwd: grid (ceil(T/(4·ROWS)), HQ, B), 128 threads; each warp owns
// ROWS query rows, lane j key j0+j of the tile. The probabilities go
// through the warp's Ps rows, read back as float4 broadcasts for O += P·V.
// Tiles have row stride DP = D rounded up to 4 (zero-padded).
template <int DC, int ROWS>
__device__ __forceinline__ void attn_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                                         const int32_t* docs, int T, int HQ, int HKV, int D, float scale, int causal,
                                         int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead,
                                         float* Qs, float* Ks, float* Vs, float* Ps) {
    const int BQ = 4 * ROWS;
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i0 = qt * BQ;
    const int g = h / (HQ / HKV);
    const int DP = (D + 3) & ~3;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const float* qb = q + (long long)b * T * qs + (long long)h * D;
    const float* kb = k + (long long)b * T * kvs + (long long)g * D;
    const float* vb = v + (long long)b * T * kvs + (long long)g * D;
    float* ps = Ps + warp * ROWS * ATTN_BK; // this warp's (ROWS, 32) probabilities

    for (int idx = threadIdx.x; idx < BQ * DP; idx += blockDim.x) {
        const int r = idx / DP, d = idx - r * DP;
        Qs[idx] = (i0 + r < T && d < D) ? qb[(long long)(i0 + r) * qs + d] : 0.0f;
    }

    float m[ROWS], l[ROWS], o[ROWS][DC];
    int docI[ROWS];
    uint64_t key[ROWS];
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++) {
        const int i = i0 + warp * ROWS + rr;
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; c++) o[rr][c] = 0.0f;
        docI[rr] = (docs != nullptr && i < T) ? docs[(long long)b * T + i] : 0;
        key[rr] = dropout ? attn_row_key(seed, b, firstHead + h, i) : 0;
    }

    const int jEnd = causal ? min(T, i0 + BQ) : T;
    for (int j0 = 0; j0 < jEnd; j0 += ATTN_BK) {
        const int nk = min(ATTN_BK, T - j0);
        __syncthreads(); // the previous tile is consumed (and Qs is loaded)
        for (int idx = threadIdx.x; idx < ATTN_BK * DP; idx += blockDim.x) {
            const int j = idx / DP, d = idx - j * DP;
            Ks[j * DP + d] = (j < nk && d < D) ? kb[(long long)(j0 + j) * kvs + d] : 0.0f;
        }
        attn_load_rows(Vs, vb, kvs, j0, nk, ATTN_BK, D);
        __syncthreads();

        const int j = j0 + lane;
        const int docJ = (docs != nullptr && j < T) ? docs[(long long)b * T + j] : 0;
        float s[ROWS];
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) s[rr] = 0.0f;
        // each lane starts at its own column: conflict-free when DP % 32 == 0
        int dd = lane % DP;
        for (int t = 0; t < DP; t++) {
            const float kv = Ks[lane * DP + dd];
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) s[rr] += Qs[(warp * ROWS + rr) * DP + dd] * kv;
            dd = dd + 1 == DP ? 0 : dd + 1;
        }
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            const int i = i0 + warp * ROWS + rr;
            const bool ok = i < T && j < T && attn_allowed(causal, i, j, docI[rr], docJ);
            const float sc = ok ? scale * s[rr] : -INFINITY;
            const float mNew = fmaxf(m[rr], attn_warp_max(sc));
            float p = 0.0f, alpha = 1.0f;
            if (mNew != -INFINITY) { // warp-uniform: nothing allowed yet keeps P 0
                p = expf(sc - mNew);
                alpha = expf(m[rr] - mNew);
            }
            l[rr] = l[rr] * alpha + attn_warp_sum(p);
            m[rr] = mNew;
#pragma unroll
            for (int c = 0; c < DC; c++) o[rr][c] *= alpha;
            if (dropout && p != 0.0f) p *= attn_keep(key[rr], j, thr, dscale);
            ps[rr * ATTN_BK + lane] = p; // 0 for keys past T
        }
        __syncwarp();
        // O += P·V: lane owns columns lane + 32c; V rows past nk are 0.
        for (int jj = 0; jj < nk; jj += 4) {
            float vv[4][DC];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int c = 0; c < DC; c++)
                    vv[u][c] = c * 32 + lane < D ? Vs[(jj + u) * D + c * 32 + lane] : 0.0f;
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                const float4 p4 = *reinterpret_cast<const float4*>(&ps[rr * ATTN_BK + jj]);
#pragma unroll
                for (int c = 0; c < DC; c++) {
                    o[rr][c] += p4.x * vv[0][c];
                    o[rr][c] += p4.y * vv[1][c];
                    o[rr][c] += p4.z * vv[2][c];
                    o[rr][c] += p4.w * vv[3][c];
                }
            }
        }
        __syncwarp(); // ps is read before the next tile overwrites it
    }

#pragma unroll
    for (int rr = 0; rr < ROWS; rr++) {
        const int i = i0 + warp * ROWS + rr;
        if (i >= T) continue;
        float* ob = out + ((long long)b * T + i) * qs + (long long)h * D;
        float inv = 0.0f, ls = -INFINITY;
        if (l[rr] != 0.0f) {
            inv = 1.0f / l[rr];
            ls = m[rr] + (float)log((double)l[rr]);
        }
#pragma unroll
        for (int c = 0; c < DC; c++)
            if (c * 32 + lane < D) ob[c * 32 + lane] = o[rr][c] * inv;
        if (lane == 0) lse[((long long)b * HQ + h) * T + i] = ls;
    }
}

// Forward instantiations: 8 query rows per warp up to D = 64, 4 up to 128
// (the tiles fill at most 48 KiB of shared memory).
#define ATTN_FWD_KERNEL(NAME, DMAX, ROWS)                                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1)                                                    \
        NAME(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* docs, int T,     \
             int HQ, int HKV, int D, float scale, int causal, int dropout, uint32_t thr, float dscale, uint64_t seed, \
             int firstHead) {                                                                                        \
        __shared__ __align__(16) float Qs[4 * ROWS * DMAX];                                                          \
        __shared__ float Ks[ATTN_BK * DMAX];                                                                         \
        __shared__ float Vs[ATTN_BK * DMAX];                                                                         \
        __shared__ __align__(16) float Ps[4 * ROWS * ATTN_BK];                                                       \
        attn_fwd<DMAX / 32, ROWS>(out, lse, q, k, v, docs, T, HQ, HKV, D, scale, causal, dropout, thr, dscale, seed, \
                                  firstHead, Qs, Ks, Vs, Ps);                                                        \
    }

ATTN_FWD_KERNEL(attn_fwd_d64_f32, 64, 8)
ATTN_FWD_KERNEL(attn_fwd_d128_f32, 128, 4)

// attn_bwd_delta_f32 writes delta[b, h, i] = dout[b, i, h, :]·out[b, i, h, :]
// (internal/cpu's D_i): one warp per (b, i, h) row, rows = B·T·HQ.
extern "C" __global__ void attn_bwd_delta_f32(float* delta, const float* dout, const float* out, long long rows, int T,
                                              int HQ, int D) {
    const int lane = threadIdx.x & 31;
    for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
         row += (long long)gridDim.x * (blockDim.x >> 5)) {
        const float* a = dout + row * D;
        const float* o = out + row * D;
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s += a[d] * o[d];
        s = attn_warp_sum(s);
        if (lane == 0) {
            // row = (b*T + i)*HQ + h
            const long long bt = row / HQ;
            const int h = (int)(row - bt * HQ);
            const long long b = bt / T;
            const int i = (int)(bt - b * T);
            delta[(b * HQ + h) * T + i] = s;
        }
    }
}

// attn_load_p stores rows [r0, r0+n) of a (stride ld) into the compact
// (cap, DP) tile s, zero past n rows and past D columns (float4-readable).
__device__ __forceinline__ void attn_load_p(float* s, const float* a, long long ld, int r0, int n, int cap, int D,
                                            int DP) {
    for (int idx = threadIdx.x; idx < cap * DP; idx += blockDim.x) {
        const int r = idx / DP, d = idx - r * DP;
        s[idx] = (r < n && d < D) ? a[(long long)(r0 + r) * ld + d] : 0.0f;
    }
}

// attn_bwd_dq: grid (ceil(T/(4·ROWS)), HQ, B), 128 threads; each warp owns
// ROWS query rows, lane j key j0+j. dq += Σ_j dS_ij k_j; dS goes through
// the warp's Ss rows, read as float4 broadcasts for the product with k.
template <int DC, int ROWS>
__device__ __forceinline__ void attn_bwd_dq(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                            const float* lse, const float* delta, const int32_t* docs, int T, int HQ,
                                            int HKV, int D, float scale, int causal, int dropout, uint32_t thr,
                                            float dscale, uint64_t seed, int firstHead, float* Qs, float* Os, float* Ks,
                                            float* Vs, float* Ss) {
    const int BQ = 4 * ROWS;
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i0 = qt * BQ;
    const int g = h / (HQ / HKV);
    const int DP = (D + 3) & ~3;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const long long qOff = (long long)b * T * qs + (long long)h * D;
    const float* kb = k + (long long)b * T * kvs + (long long)g * D;
    const float* vb = v + (long long)b * T * kvs + (long long)g * D;
    float* ss = Ss + warp * ROWS * ATTN_BK;

    attn_load_p(Qs, q + qOff, qs, i0, min(BQ, T - i0), BQ, D, DP);
    attn_load_p(Os, dout + qOff, qs, i0, min(BQ, T - i0), BQ, D, DP);

    float acc[ROWS][DC], li[ROWS], di[ROWS];
    int docI[ROWS];
    uint64_t key[ROWS];
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++) {
        const int i = i0 + warp * ROWS + rr;
#pragma unroll
        for (int c = 0; c < DC; c++) acc[rr][c] = 0.0f;
        const long long at = ((long long)b * HQ + h) * T + i;
        li[rr] = i < T ? lse[at] : -INFINITY;
        di[rr] = i < T ? delta[at] : 0.0f;
        docI[rr] = (docs != nullptr && i < T) ? docs[(long long)b * T + i] : 0;
        key[rr] = dropout ? attn_row_key(seed, b, firstHead + h, i) : 0;
    }

    const int jEnd = causal ? min(T, i0 + BQ) : T;
    for (int j0 = 0; j0 < jEnd; j0 += ATTN_BK) {
        const int nk = min(ATTN_BK, T - j0);
        __syncthreads();
        attn_load_p(Ks, kb, kvs, j0, nk, ATTN_BK, D, DP);
        attn_load_p(Vs, vb, kvs, j0, nk, ATTN_BK, D, DP);
        __syncthreads();

        const int j = j0 + lane;
        const int docJ = (docs != nullptr && j < T) ? docs[(long long)b * T + j] : 0;
        float s[ROWS], dp[ROWS];
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) s[rr] = dp[rr] = 0.0f;
        int dd = lane % DP;
        for (int t = 0; t < DP; t++) {
            const float kv = Ks[lane * DP + dd], vv = Vs[lane * DP + dd];
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                const int r = warp * ROWS + rr;
                s[rr] += Qs[r * DP + dd] * kv;
                dp[rr] += Os[r * DP + dd] * vv;
            }
            dd = dd + 1 == DP ? 0 : dd + 1;
        }
        // dS = P*(Z*dP - D_i)*scale, P = exp(scale*s - lse) (0 where masked
        // or the row has no allowed key).
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            const int i = i0 + warp * ROWS + rr;
            const bool ok = i < T && j < T && li[rr] != -INFINITY && attn_allowed(causal, i, j, docI[rr], docJ);
            const float p = ok ? expf(scale * s[rr] - li[rr]) : 0.0f;
            float ds;
            if (dropout) {
                const float z = attn_keep(key[rr], j, thr, dscale);
                ds = p * (z * dp[rr] - di[rr]) * scale;
            } else {
                ds = p * (dp[rr] - di[rr]) * scale;
            }
            ss[rr * ATTN_BK + lane] = ds; // 0 for keys past T
        }
        __syncwarp();
        for (int jj = 0; jj < nk; jj += 4) {
            float kv[4][DC];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int c = 0; c < DC; c++) kv[u][c] = c * 32 + lane < D ? Ks[(jj + u) * DP + c * 32 + lane] : 0.0f;
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                const float4 d4 = *reinterpret_cast<const float4*>(&ss[rr * ATTN_BK + jj]);
#pragma unroll
                for (int c = 0; c < DC; c++) {
                    acc[rr][c] += d4.x * kv[0][c];
                    acc[rr][c] += d4.y * kv[1][c];
                    acc[rr][c] += d4.z * kv[2][c];
                    acc[rr][c] += d4.w * kv[3][c];
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++) {
        const int i = i0 + warp * ROWS + rr;
        if (i >= T) continue;
        float* row = dq + qOff + (long long)i * qs;
#pragma unroll
        for (int c = 0; c < DC; c++)
            if (c * 32 + lane < D) row[c * 32 + lane] += acc[rr][c];
    }
}

// dq instantiations: 4 query rows per warp up to D = 64, 3 up to 128.
#define ATTN_DQ_KERNEL(NAME, DMAX, ROWS)                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1)                                                    \
        NAME(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,         \
             const float* delta, const int32_t* docs, int T, int HQ, int HKV, int D, float scale, int causal,         \
             int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead) {                                \
        __shared__ __align__(16) float Qs[4 * ROWS * DMAX];                                                          \
        __shared__ __align__(16) float Os[4 * ROWS * DMAX];                                                          \
        __shared__ float Ks[ATTN_BK * DMAX];                                                                         \
        __shared__ float Vs[ATTN_BK * DMAX];                                                                         \
        __shared__ __align__(16) float Ss[4 * ROWS * ATTN_BK];                                                       \
        attn_bwd_dq<DMAX / 32, ROWS>(dq, dout, q, k, v, lse, delta, docs, T, HQ, HKV, D, scale, causal, dropout,     \
                                     thr, dscale, seed, firstHead, Qs, Os, Ks, Vs, Ss);                              \
    }

ATTN_DQ_KERNEL(attn_bwd_dq_d64_f32, 64, 4)
ATTN_DQ_KERNEL(attn_bwd_dq_d128_f32, 128, 3)

// attn_bwd_dkv: grid (ceil(T/(4·KEYS)), HKV, B), 128 threads; each warp
// owns KEYS keys of KV head g, lane i query i0+i of a 32-query tile. For
// the block's keys: dv += Σ_{h in group, i} P̃_ij dout_i and
// dk += Σ dS_ij q_i, query heads in order, query tiles in order. P̃ and dS
// go through the warp's Ps, Ss rows, read as float4 broadcasts for the
// products with dout and q (tiles Qt, Ot: 32 query rows).
template <int DC, int KEYS>
__device__ __forceinline__ void attn_bwd_dkv(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                             const float* v, const float* lse, const float* delta,
                                             const int32_t* docs, int T, int HQ, int HKV, int D, float scale,
                                             int causal, int dropout, uint32_t thr, float dscale, uint64_t seed,
                                             int firstHead, float* Ks, float* Vs, float* Qt, float* Ot, float* Ps,
                                             float* Ss) {
    const int BK = 4 * KEYS;
    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = kt * BK;
    const int grp = HQ / HKV;
    const int DP = (D + 3) & ~3;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const long long kvOff = (long long)b * T * kvs + (long long)g * D;
    float* ps = Ps + warp * KEYS * ATTN_BK;
    float* ss = Ss + warp * KEYS * ATTN_BK;

    attn_load_p(Ks, k + kvOff, kvs, j0, min(BK, T - j0), BK, D, DP);
    attn_load_p(Vs, v + kvOff, kvs, j0, min(BK, T - j0), BK, D, DP);

    float dkAcc[KEYS][DC], dvAcc[KEYS][DC];
    int docJ[KEYS];
#pragma unroll
    for (int rk = 0; rk < KEYS; rk++) {
        const int j = j0 + warp * KEYS + rk;
#pragma unroll
        for (int c = 0; c < DC; c++) dkAcc[rk][c] = dvAcc[rk][c] = 0.0f;
        docJ[rk] = (docs != nullptr && j < T) ? docs[(long long)b * T + j] : 0;
    }

    const int iStart = causal ? j0 / ATTN_DKV_BQ * ATTN_DKV_BQ : 0;
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        const long long qOff = (long long)b * T * qs + (long long)h * D;
        for (int i0 = iStart; i0 < T; i0 += ATTN_DKV_BQ) {
            const int nq = min(ATTN_DKV_BQ, T - i0);
            __syncthreads(); // the previous tile is consumed (and Ks, Vs loaded)
            attn_load_p(Qt, q + qOff, qs, i0, nq, ATTN_DKV_BQ, D, DP);
            attn_load_p(Ot, dout + qOff, qs, i0, nq, ATTN_DKV_BQ, D, DP);
            __syncthreads();

            const int i = i0 + lane;
            const long long at = ((long long)b * HQ + h) * T + i;
            const float li = i < T ? lse[at] : -INFINITY;
            const float di = i < T ? delta[at] : 0.0f;
            const int docI = (docs != nullptr && i < T) ? docs[(long long)b * T + i] : 0;
            const uint64_t key = dropout ? attn_row_key(seed, b, firstHead + h, i) : 0;

            float s[KEYS], dp[KEYS];
#pragma unroll
            for (int rk = 0; rk < KEYS; rk++) s[rk] = dp[rk] = 0.0f;
            int dd = lane % DP;
            for (int t = 0; t < DP; t++) {
                const float qv = Qt[lane * DP + dd], ov = Ot[lane * DP + dd];
#pragma unroll
                for (int rk = 0; rk < KEYS; rk++) {
                    const int r = warp * KEYS + rk;
                    s[rk] += qv * Ks[r * DP + dd];
                    dp[rk] += ov * Vs[r * DP + dd];
                }
                dd = dd + 1 == DP ? 0 : dd + 1;
            }
#pragma unroll
            for (int rk = 0; rk < KEYS; rk++) {
                const int j = j0 + warp * KEYS + rk;
                const bool ok = i < T && j < T && li != -INFINITY && attn_allowed(causal, i, j, docI, docJ[rk]);
                const float p = ok ? expf(scale * s[rk] - li) : 0.0f;
                if (dropout) {
                    const float z = attn_keep(key, j, thr, dscale);
                    ss[rk * ATTN_BK + lane] = p * (z * dp[rk] - di) * scale;
                    ps[rk * ATTN_BK + lane] = p * z;
                } else {
                    ss[rk * ATTN_BK + lane] = p * (dp[rk] - di) * scale;
                    ps[rk * ATTN_BK + lane] = p;
                }
            }
            __syncwarp();
            for (int ii = 0; ii < nq; ii += 4) {
                float qv[4][DC], ov[4][DC];
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int c = 0; c < DC; c++) {
                        const bool in = c * 32 + lane < D;
                        qv[u][c] = in ? Qt[(ii + u) * DP + c * 32 + lane] : 0.0f;
                        ov[u][c] = in ? Ot[(ii + u) * DP + c * 32 + lane] : 0.0f;
                    }
#pragma unroll
                for (int rk = 0; rk < KEYS; rk++) {
                    const float4 p4 = *reinterpret_cast<const float4*>(&ps[rk * ATTN_BK + ii]);
                    const float4 d4 = *reinterpret_cast<const float4*>(&ss[rk * ATTN_BK + ii]);
#pragma unroll
                    for (int c = 0; c < DC; c++) {
                        dvAcc[rk][c] += p4.x * ov[0][c];
                        dvAcc[rk][c] += p4.y * ov[1][c];
                        dvAcc[rk][c] += p4.z * ov[2][c];
                        dvAcc[rk][c] += p4.w * ov[3][c];
                        dkAcc[rk][c] += d4.x * qv[0][c];
                        dkAcc[rk][c] += d4.y * qv[1][c];
                        dkAcc[rk][c] += d4.z * qv[2][c];
                        dkAcc[rk][c] += d4.w * qv[3][c];
                    }
                }
            }
            __syncwarp();
        }
    }
#pragma unroll
    for (int rk = 0; rk < KEYS; rk++) {
        const int j = j0 + warp * KEYS + rk;
        if (j >= T) continue;
        float* dkr = dk + kvOff + (long long)j * kvs;
        float* dvr = dv + kvOff + (long long)j * kvs;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            if (c * 32 + lane < D) {
                dkr[c * 32 + lane] += dkAcc[rk][c];
                dvr[c * 32 + lane] += dvAcc[rk][c];
            }
        }
    }
}

// dk/dv instantiations: 4 keys per warp up to D = 64, 3 up to 128.
#define ATTN_DKV_KERNEL(NAME, DMAX, KEYS)                                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1)                                                    \
        NAME(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,                \
             const float* lse, const float* delta, const int32_t* docs, int T, int HQ, int HKV, int D, float scale,  \
             int causal, int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead) {                    \
        __shared__ __align__(16) float Ks[4 * KEYS * DMAX];                                                          \
        __shared__ __align__(16) float Vs[4 * KEYS * DMAX];                                                          \
        __shared__ float Qt[ATTN_DKV_BQ * DMAX];                                                                     \
        __shared__ float Ot[ATTN_DKV_BQ * DMAX];                                                                     \
        __shared__ __align__(16) float Ps[4 * KEYS * ATTN_BK];                                                       \
        __shared__ __align__(16) float Ss[4 * KEYS * ATTN_BK];                                                       \
        attn_bwd_dkv<DMAX / 32, KEYS>(dk, dv, dout, q, k, v, lse, delta, docs, T, HQ, HKV, D, scale, causal,         \
                                      dropout, thr, dscale, seed, firstHead, Ks, Vs, Qt, Ot, Ps, Ss);                \
    }

ATTN_DKV_KERNEL(attn_bwd_dkv_d64_f32, 64, 4)
ATTN_DKV_KERNEL(attn_bwd_dkv_d128_f32, 128, 3)
