// Tensor-core flash attention (FlashAttention-2's schedule) with bf16
// operands and float32 accumulators: the CUDA backend's attention under
// --bf16 when GOTRON_CUDA_UNVERIFIED names flash-tc
// (tensor/cuda_backend_attntc.go). Built, not yet run on a GPU.
//
// Layouts and semantics are attn.cu's (internal/cpu's): q, out, dq, dout
// (B, T, HQ, D) float32; k, v, dk, dv (B, T, HKV, D) float32; lse and delta
// (B, HQ, T) float32; docs int32 (B, T) or null; query head h reads KV head
// h / (HQ / HKV). Masked scores (causal j + kpos > i + qpos, another
// document, past T) are excluded; a row with no allowed key gets out 0 and
// lse -Inf; lse is taken before dropout; dropout multiplies the normalised
// probabilities by 0 or 1/(1-p) with the keyed splitmix64 masks of
// internal/cpu/attention_dropout.go, keyed by sequence positions (i + qpos,
// j + kpos), bit for bit attn.cu's masks. With accumulate the forward merges
// into the partial out and lse already there, as attnmat.cu does.
//
// Arithmetic (what tensor's attntc emulation test mirrors): the kernels read
// float32 q, k, v, dout and round them to bfloat16 (nearest even) into
// shared memory; every product is mma.sync.m16n8k16 (bf16 × bf16, float32
// accumulate). Scores, the running max m and sum l, the rescaling
// alpha = e^(m_old - m_new), lse, P, dP, dS and delta stay float32; P·Z is
// rounded to bf16 before P̃·V and before dV += P̃ᵀ·dO, dS before dQ += dS·K
// and dK += dSᵀ·Q.
//
// Schedule. 128 threads = 4 warps; each warp owns 16 rows of its block's
// side (queries in the forward and dq, keys in dk/dv), so its m16n8k16
// accumulators hold a 16-row stripe. Fragment layout (PTX ISA,
// mma.m16n8k16, g = lane / 4, t = lane % 4): A a0 = (g, 2t..2t+1), a1 =
// (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B b0 = (k 2t..2t+1, n
// g), b1 = (k 2t+8.., n g); C c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..).
// Every operand sits in shared memory with its k pairs adjacent, so each
// fragment register is one 32-bit load: tiles used as the k = head
// dimension side are row-major [row][D + 8], tiles used with k = sequence
// are stored transposed [D][rows + 8] at load time (the +8 padding makes
// the fragment loads of 8 rows × 4 pairs hit 32 different banks). A
// score accumulator C is, rounded, the A operand of the next product (the
// FlashAttention-2 register reuse): keys 16kk.. of the stripe are
// (c[2kk][0..1], c[2kk][2..3], c[2kk+1][0..1], c[2kk+1][2..3]).
//
//   forward  grid (⌈T/64⌉, HQ, B): 64 queries; key blocks of 64 in order,
//            online softmax per key block; causal blocks past the diagonal
//            are skipped.
//   delta    attn.cu's attn_bwd_delta_f32 (float32 dout·out).
//   dq       grid (⌈T/64⌉, HQ, B): 64 queries; key blocks of 64 in order,
//            P recomputed from lse; dQ += dS·K.
//   dk, dv   grid (⌈T/64⌉, HKV, B): 64 keys; the group's query heads in
//            order, query blocks of BQ (64 at D ≤ 64, 32 at D ≤ 128) in
//            order; dV += P̃ᵀ·dO, dK += dSᵀ·Q.
// dq and dk/dv are separate kernels that each recompute S and dP (seven
// products per tile instead of FlashAttention-2's five), so there are no
// atomics and the backward is deterministic. Results are added to dq, dk,
// dv (the backend's accumulate contract).
//
// Shared memory is dynamic (above 48 KiB at D = 128; cuda.Device.Launch
// raises the function's limit): the host computes the bytes
// (attntcSharedBytes in tensor/cuda_backend_attntc.go, the ATC_*_SMEM
// formulas here), and each kernel traps if it got fewer.

// testdata/attntc_host.cc compiles this file for the host with
// ATTNTC_HOST defined: it runs every thread of a block as a host thread and
// supplies attntc_host_mma (mma.sync from the PTX ISA's fragment layouts)
// and attntc_host_dynamic_smem, the two instructions below written in PTX,
// so TestAttntcHostKernels runs these kernels' own index math against the
// CPU backend without a GPU.

#include <stdint.h>

#define ATC_THREADS 128
#define ATC_GOLDEN 0x9E3779B97F4A7C15ull
#define ATC_PAD 8  // bf16 elements of padding per shared row
#define ATC_BQ 64  // queries per forward and dq block
#define ATC_BK 64  // keys per key block (forward, dq) and per dk/dv block

// attntc_mix64, attntc_row_key and attntc_keep are attn.cu's attn_mix64,
// attn_row_key and attn_keep verbatim (families compile one by one).
__device__ __forceinline__ uint64_t attntc_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t attntc_row_key(uint64_t seed, int b, int head, int i) {
    uint64_t k = attntc_mix64(seed + (uint64_t)(b + 1) * ATC_GOLDEN);
    k = attntc_mix64(k + (uint64_t)(head + 1) * ATC_GOLDEN);
    return attntc_mix64(k + (uint64_t)(i + 1) * ATC_GOLDEN);
}

__device__ __forceinline__ float attntc_keep(uint64_t rowKey, int j, uint32_t thr, float dscale) {
    uint64_t x = attntc_mix64(rowKey + (uint64_t)(j >> 1) * ATC_GOLDEN);
    uint32_t bits = (j & 1) ? (uint32_t)(x >> 32) : (uint32_t)x;
    return bits >= thr ? dscale : 0.0f;
}

// attntc_keep2 sets z0, z1 to the multipliers of keys jk and jk + 1 (jk a
// sequence position) of the row keyed rowKey: one hash for both when jk is
// even (they are one pair), two when it is odd (block attention with an
// odd kpos).
__device__ __forceinline__ void attntc_keep2(uint64_t rowKey, int jk, uint32_t thr, float dscale, float& z0,
                                             float& z1) {
    const uint64_t x = attntc_mix64(rowKey + (uint64_t)(jk >> 1) * ATC_GOLDEN);
    if ((jk & 1) == 0) {
        z0 = (uint32_t)x >= thr ? dscale : 0.0f;
        z1 = (uint32_t)(x >> 32) >= thr ? dscale : 0.0f;
    } else {
        z0 = (uint32_t)(x >> 32) >= thr ? dscale : 0.0f;
        z1 = attntc_keep(rowKey, jk + 1, thr, dscale);
    }
}

// attntc_bf16 rounds f to bfloat16, nearest even (elem.cu's bf16_from_f32
// without its NaN case: internal/half.BFloat16From for every non-NaN).
__device__ __forceinline__ uint32_t attntc_bf16(float f) {
    uint32_t b = __float_as_uint(f);
    b += 0x7FFFu + ((b >> 16) & 1u);
    return b >> 16;
}

// attntc_pack packs (lo, hi) rounded to bf16 into one register, lo in the
// low half (the lower k index of a fragment pair).
__device__ __forceinline__ uint32_t attntc_pack(float lo, float hi) {
    return attntc_bf16(lo) | (attntc_bf16(hi) << 16);
}

// attntc_mma: c += a·b, m16n8k16, bf16 operands, float32 accumulators.
__device__ __forceinline__ void attntc_mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
#ifdef ATTNTC_HOST
    attntc_host_mma(c, a0, a1, a2, a3, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// attntc_ld32 reads the bf16 pair at s[idx], s[idx+1] (idx even).
__device__ __forceinline__ uint32_t attntc_ld32(const uint16_t* s, int idx) {
    return *reinterpret_cast<const uint32_t*>(s + idx);
}

// attntc_mma_tile: c[n] += A·B over K = 16·KSTEPS for NT n-tiles of 8,
// A the 16-row stripe at row r0 of the row-major tile a (stride lda), B
// the n-major tile bm ([n][k], stride ldb) from row n0. Both have k
// adjacent: a fragment register is one 32-bit load.
template <int KSTEPS, int NT>
__device__ __forceinline__ void attntc_mma_tile(float (*c)[4], const uint16_t* a, int lda, int r0, const uint16_t* bm,
                                                int ldb, int n0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        const int k0 = 16 * kk + 2 * t;
        const uint32_t a0 = attntc_ld32(a, (r0 + g) * lda + k0), a1 = attntc_ld32(a, (r0 + g + 8) * lda + k0);
        const uint32_t a2 = attntc_ld32(a, (r0 + g) * lda + k0 + 8), a3 = attntc_ld32(a, (r0 + g + 8) * lda + k0 + 8);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int n = n0 + 8 * nt + g;
            attntc_mma(c[nt], a0, a1, a2, a3, attntc_ld32(bm, n * ldb + k0), attntc_ld32(bm, n * ldb + k0 + 8));
        }
    }
}

// attntc_mma_regs: c[n] += P·B with P the 16 × 16·KSTEPS stripe held in
// score accumulators p (the C layout; rounded to bf16 here) and B the
// n-major tile bm ([n][k], stride ldb), NT n-tiles of 8.
template <int KSTEPS, int NT>
__device__ __forceinline__ void attntc_mma_regs(float (*c)[4], const float (*p)[4], const uint16_t* bm, int ldb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        const uint32_t a0 = attntc_pack(p[2 * kk][0], p[2 * kk][1]), a1 = attntc_pack(p[2 * kk][2], p[2 * kk][3]);
        const uint32_t a2 = attntc_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        const uint32_t a3 = attntc_pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
        const int k0 = 16 * kk + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int n = 8 * nt + g;
            attntc_mma(c[nt], a0, a1, a2, a3, attntc_ld32(bm, n * ldb + k0), attntc_ld32(bm, n * ldb + k0 + 8));
        }
    }
}

// attntc_load loads rows [r0, r0+rows) of x (row stride ld floats, D used)
// as bf16 into s: row-major [r][D + ATC_PAD] when trans is 0, transposed
// [d][rows + ATC_PAD] when 1; rows past nValid are 0.
__device__ __forceinline__ void attntc_load(uint16_t* s, const float* x, long long ld, int r0, int nValid, int rows,
                                            int D, int trans) {
    for (int idx = threadIdx.x; idx < rows * D; idx += ATC_THREADS) {
        const int r = idx / D, d = idx - r * D;
        const float v = r < nValid ? x[(long long)(r0 + r) * ld + d] : 0.0f;
        s[trans ? d * (rows + ATC_PAD) + r : r * (D + ATC_PAD) + d] = (uint16_t)attntc_bf16(v);
    }
}

// attntc_check_smem traps when the launch gave fewer dynamic shared bytes
// than the kernel's layout needs (the host's attntcSharedBytes is wrong).
__device__ __forceinline__ void attntc_check_smem(uint32_t need) {
    uint32_t have;
#ifdef ATTNTC_HOST
    have = attntc_host_dynamic_smem();
#else
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
#endif
    if (have < need) __trap();
}

// attntc_row_max and attntc_row_sum reduce over the 4 lanes of a row (t).
__device__ __forceinline__ float attntc_row_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float attntc_row_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ bool attntc_allowed(int causal, int iOff, int j, int docI, int docJ) {
    return !(causal && j > iOff) && docI == docJ;
}

// Shared bytes per kernel (bf16 = 2 bytes; the dk/dv kernel adds per-query
// lse, delta, document and dropout key tables of 4+4+4+8 bytes).
#define ATC_FWD_SMEM(D) (2 * (2 * ATC_BK * ((D) + ATC_PAD) + (D) * (ATC_BK + ATC_PAD)))
#define ATC_DQ_SMEM(D) (2 * (4 * ATC_BK * ((D) + ATC_PAD) + (D) * (ATC_BK + ATC_PAD)))
#define ATC_DKV_SMEM(D, BQ) \
    (2 * (2 * ATC_BK * ((D) + ATC_PAD) + 2 * (BQ) * ((D) + ATC_PAD) + 2 * (D) * ((BQ) + ATC_PAD)) + 20 * (BQ))

// attntc_fwd: grid (⌈T/64⌉, HQ, B). Warp w owns query rows i0 + 16w + g
// (accumulator halves 0) and + 8 (halves 1).
template <int D>
__device__ __forceinline__ void attntc_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                                           const int32_t* docs, int T, int HQ, int HKV, float scale, int causal,
                                           int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead,
                                           int qpos, int kpos, int accumulate) {
    extern __shared__ __align__(16) uint16_t atc_smem[];
    attntc_check_smem(ATC_FWD_SMEM(D));
    const int LD = D + ATC_PAD, LDT = ATC_BK + ATC_PAD;
    uint16_t* Qs = atc_smem;            // [64][LD]
    uint16_t* Ks = Qs + ATC_BQ * LD;    // [64][LD]
    uint16_t* Vt = Ks + ATC_BK * LD;    // [D][LDT]
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (HQ / HKV);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = blockIdx.x * ATC_BQ, off = qpos - kpos;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const float* qb = q + (long long)b * T * qs + (long long)h * D;
    const float* kb = k + (long long)b * T * kvs + (long long)kvh * D;
    const float* vb = v + (long long)b * T * kvs + (long long)kvh * D;
    attntc_load(Qs, qb, qs, i0, min(ATC_BQ, T - i0), ATC_BQ, D, 0);

    int iRow[2], docI[2];
    uint64_t key[2];
    float m[2], l[2], old[2], o[D / 8][4];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        iRow[hf] = i0 + 16 * warp + g + 8 * hf;
        // the partial lse to merge into, read before any lane writes it
        old[hf] = (accumulate && iRow[hf] < T) ? lse[((long long)b * HQ + h) * T + iRow[hf]] : -INFINITY;
        docI[hf] = (docs != nullptr && iRow[hf] < T) ? docs[(long long)b * T + iRow[hf]] : 0;
        key[hf] = dropout ? attntc_row_key(seed, b, firstHead + h, iRow[hf] + qpos) : 0;
        m[hf] = -INFINITY;
        l[hf] = 0.0f;
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;

    const int jEnd = causal ? max(0, min(T, i0 + ATC_BQ + off)) : T;
    for (int j0 = 0; j0 < jEnd; j0 += ATC_BK) {
        const int nk = min(ATC_BK, T - j0);
        __syncthreads(); // the previous block's tiles are consumed
        attntc_load(Ks, kb, kvs, j0, nk, ATC_BK, D, 0);
        attntc_load(Vt, vb, kvs, j0, nk, ATC_BK, D, 1);
        __syncthreads();

        float s[ATC_BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATC_BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        attntc_mma_tile<D / 16, ATC_BK / 8>(s, Qs, LD, 16 * warp, Ks, LD, 0); // S = Q·Kᵀ

        float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < ATC_BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e >> 1, j = j0 + 8 * nt + 2 * t + (e & 1);
                const int docJ = (docs != nullptr && j < T) ? docs[(long long)b * T + j] : 0;
                const bool ok = iRow[hf] < T && j < T && attntc_allowed(causal, iRow[hf] + off, j, docI[hf], docJ);
                s[nt][e] = ok ? scale * s[nt][e] : -INFINITY;
                bmax[hf] = fmaxf(bmax[hf], s[nt][e]);
            }
        float alpha[2], mNew[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            mNew[hf] = fmaxf(m[hf], attntc_row_max(bmax[hf]));
            // nothing allowed yet keeps P 0 and the (zero) sums as they are
            alpha[hf] = mNew[hf] == -INFINITY ? 1.0f : expf(m[hf] - mNew[hf]);
        }
        float bsum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < ATC_BK / 8; nt++) {
            float z[4]; // keys j0 + 8nt + 2t and + 1 of rows g and g + 8
            if (dropout) {
                attntc_keep2(key[0], j0 + 8 * nt + 2 * t + kpos, thr, dscale, z[0], z[1]);
                attntc_keep2(key[1], j0 + 8 * nt + 2 * t + kpos, thr, dscale, z[2], z[3]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e >> 1;
                float p = s[nt][e] == -INFINITY ? 0.0f : expf(s[nt][e] - mNew[hf]);
                bsum[hf] += p;
                if (dropout) p *= z[e];
                s[nt][e] = p; // P·Z, rounded to bf16 by attntc_mma_regs
            }
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            l[hf] = l[hf] * alpha[hf] + attntc_row_sum(bsum[hf]);
            m[hf] = mNew[hf];
        }
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
        attntc_mma_regs<ATC_BK / 16, D / 8>(o, s, Vt, LDT); // O += P̃·V
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int i = iRow[hf];
        if (i >= T) continue;
        float* lp = lse + ((long long)b * HQ + h) * T + i;
        float* ob = out + ((long long)b * T + i) * qs + (long long)h * D;
        const float lsNew = l[hf] != 0.0f ? m[hf] + logf(l[hf]) : -INFINITY;
        // out = out_old·aOld + o·aNew (o unnormalised: aNew = e^(m - lse'))
        float ls = lsNew, aOld = 0.0f, aNew = lsNew == -INFINITY ? 0.0f : 1.0f / l[hf];
        if (old[hf] != -INFINITY) {
            if (lsNew == -INFINITY) {
                ls = old[hf], aOld = 1.0f;
            } else {
                const float mx = fmaxf(old[hf], lsNew);
                ls = mx + logf(expf(old[hf] - mx) + expf(lsNew - mx));
                aOld = expf(old[hf] - ls);
                aNew = expf(m[hf] - ls);
            }
        }
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            const int d = 8 * nd + 2 * t;
            float o0 = o[nd][2 * hf] * aNew, o1 = o[nd][2 * hf + 1] * aNew;
            if (aOld != 0.0f) {
                o0 += ob[d] * aOld;
                o1 += ob[d + 1] * aOld;
            }
            ob[d] = o0;
            ob[d + 1] = o1;
        }
        if (t == 0) *lp = ls;
    }
}

#define ATC_FWD_KERNEL(NAME, D)                                                                                       \
    extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1)                                                      \
        NAME(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* docs, int T,      \
             int HQ, int HKV, float scale, int causal, int dropout, uint32_t thr, float dscale, uint64_t seed,         \
             int firstHead, int qpos, int kpos, int accumulate) {                                                     \
        attntc_fwd<D>(out, lse, q, k, v, docs, T, HQ, HKV, scale, causal, dropout, thr, dscale, seed, firstHead,     \
                      qpos, kpos, accumulate);                                                                        \
    }

ATC_FWD_KERNEL(attntc_fwd_d64_bf16, 64)
ATC_FWD_KERNEL(attntc_fwd_d128_bf16, 128)

// attntc_bwd_dq: grid (⌈T/64⌉, HQ, B). Warp w owns query rows
// i0 + 16w + g (+8). Per key block: S = Q·Kᵀ, dP = dO·Vᵀ, P from lse,
// dS = P·(Z·dP - delta)·scale, dQ += dS·K (K transposed in Kt).
template <int D>
__device__ __forceinline__ void attntc_bwd_dq(float* dq, const float* dout, const float* q, const float* k,
                                              const float* v, const float* lse, const float* delta,
                                              const int32_t* docs, int T, int HQ, int HKV, float scale, int causal,
                                              int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead,
                                              int qpos, int kpos) {
    extern __shared__ __align__(16) uint16_t atc_smem[];
    attntc_check_smem(ATC_DQ_SMEM(D));
    const int LD = D + ATC_PAD, LDT = ATC_BK + ATC_PAD;
    uint16_t* Qs = atc_smem;           // [64][LD]
    uint16_t* Os = Qs + ATC_BQ * LD;   // dout [64][LD]
    uint16_t* Ks = Os + ATC_BQ * LD;   // [64][LD]
    uint16_t* Vs = Ks + ATC_BK * LD;   // [64][LD]
    uint16_t* Kt = Vs + ATC_BK * LD;   // [D][LDT]
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (HQ / HKV);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = blockIdx.x * ATC_BQ, off = qpos - kpos;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const long long qOff = (long long)b * T * qs + (long long)h * D;
    const float* kb = k + (long long)b * T * kvs + (long long)kvh * D;
    const float* vb = v + (long long)b * T * kvs + (long long)kvh * D;
    attntc_load(Qs, q + qOff, qs, i0, min(ATC_BQ, T - i0), ATC_BQ, D, 0);
    attntc_load(Os, dout + qOff, qs, i0, min(ATC_BQ, T - i0), ATC_BQ, D, 0);

    int iRow[2], docI[2];
    uint64_t key[2];
    float li[2], di[2], acc[D / 8][4];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int i = i0 + 16 * warp + g + 8 * hf;
        const long long at = ((long long)b * HQ + h) * T + i;
        iRow[hf] = i;
        li[hf] = i < T ? lse[at] : -INFINITY;
        di[hf] = i < T ? delta[at] : 0.0f;
        docI[hf] = (docs != nullptr && i < T) ? docs[(long long)b * T + i] : 0;
        key[hf] = dropout ? attntc_row_key(seed, b, firstHead + h, i + qpos) : 0;
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    const int jEnd = causal ? max(0, min(T, i0 + ATC_BQ + off)) : T;
    for (int j0 = 0; j0 < jEnd; j0 += ATC_BK) {
        const int nk = min(ATC_BK, T - j0);
        __syncthreads();
        attntc_load(Ks, kb, kvs, j0, nk, ATC_BK, D, 0);
        attntc_load(Vs, vb, kvs, j0, nk, ATC_BK, D, 0);
        attntc_load(Kt, kb, kvs, j0, nk, ATC_BK, D, 1);
        __syncthreads();

        float s[ATC_BK / 8][4], dp[ATC_BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATC_BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
        attntc_mma_tile<D / 16, ATC_BK / 8>(s, Qs, LD, 16 * warp, Ks, LD, 0);  // S = Q·Kᵀ
        attntc_mma_tile<D / 16, ATC_BK / 8>(dp, Os, LD, 16 * warp, Vs, LD, 0); // dP = dO·Vᵀ
#pragma unroll
        for (int nt = 0; nt < ATC_BK / 8; nt++) {
            float z[4] = {1.0f, 1.0f, 1.0f, 1.0f}; // keys j0 + 8nt + 2t and + 1 of rows g and g + 8
            if (dropout) {
                attntc_keep2(key[0], j0 + 8 * nt + 2 * t + kpos, thr, dscale, z[0], z[1]);
                attntc_keep2(key[1], j0 + 8 * nt + 2 * t + kpos, thr, dscale, z[2], z[3]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e >> 1, j = j0 + 8 * nt + 2 * t + (e & 1);
                const int docJ = (docs != nullptr && j < T) ? docs[(long long)b * T + j] : 0;
                const bool ok = iRow[hf] < T && j < T && li[hf] != -INFINITY &&
                                attntc_allowed(causal, iRow[hf] + off, j, docI[hf], docJ);
                const float p = ok ? expf(scale * s[nt][e] - li[hf]) : 0.0f;
                s[nt][e] = p * (z[e] * dp[nt][e] - di[hf]) * scale; // dS, rounded by attntc_mma_regs
            }
        }
        attntc_mma_regs<ATC_BK / 16, D / 8>(acc, s, Kt, LDT); // dQ += dS·K
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int i = iRow[hf];
        if (i >= T) continue;
        float* row = dq + qOff + (long long)i * qs;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            const int d = 8 * nd + 2 * t;
            row[d] += acc[nd][2 * hf];
            row[d + 1] += acc[nd][2 * hf + 1];
        }
    }
}

#define ATC_DQ_KERNEL(NAME, D)                                                                                        \
    extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1)                                                      \
        NAME(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,          \
             const float* delta, const int32_t* docs, int T, int HQ, int HKV, float scale, int causal, int dropout,   \
             uint32_t thr, float dscale, uint64_t seed, int firstHead, int qpos, int kpos) {                          \
        attntc_bwd_dq<D>(dq, dout, q, k, v, lse, delta, docs, T, HQ, HKV, scale, causal, dropout, thr, dscale, seed, \
                         firstHead, qpos, kpos);                                                                      \
    }

ATC_DQ_KERNEL(attntc_bwd_dq_d64_bf16, 64)
ATC_DQ_KERNEL(attntc_bwd_dq_d128_bf16, 128)

// attntc_bwd_dkv: grid (⌈T/64⌉, HKV, B). Warp w owns keys j0 + 16w + g
// (+8); the accumulators' n side is queries. Per query head of the group
// and query block of BQ: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, P from lse,
// dSᵀ = P·(Z·dP - delta)·scale, dV += (P·Z)ᵀ·dO and dK += dSᵀ·Q (dO and Q
// transposed in Ot and Qt).
template <int D, int BQ>
__device__ __forceinline__ void attntc_bwd_dkv(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                               const float* v, const float* lse, const float* delta,
                                               const int32_t* docs, int T, int HQ, int HKV, float scale, int causal,
                                               int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead,
                                               int qpos, int kpos) {
    extern __shared__ __align__(16) uint16_t atc_smem[];
    attntc_check_smem(ATC_DKV_SMEM(D, BQ));
    const int LD = D + ATC_PAD, LDT = BQ + ATC_PAD;
    uint16_t* Ks = atc_smem;          // [64][LD]
    uint16_t* Vs = Ks + ATC_BK * LD;  // [64][LD]
    uint16_t* Qs = Vs + ATC_BK * LD;  // [BQ][LD]
    uint16_t* Os = Qs + BQ * LD;      // dout [BQ][LD]
    uint16_t* Qt = Os + BQ * LD;      // [D][LDT]
    uint16_t* Ot = Qt + D * LDT;      // [D][LDT]
    uint64_t* Rk = reinterpret_cast<uint64_t*>(Ot + D * LDT); // dropout row keys [BQ] (8-byte aligned: see the sizes)
    float* Ls = reinterpret_cast<float*>(Rk + BQ);             // lse [BQ]
    float* Ds = Ls + BQ;                                        // delta [BQ]
    int* Dq = reinterpret_cast<int*>(Ds + BQ);                  // documents [BQ]
    const int kvh = blockIdx.y, b = blockIdx.z, grp = HQ / HKV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j0 = blockIdx.x * ATC_BK, off = qpos - kpos;
    const long long qs = (long long)HQ * D, kvs = (long long)HKV * D;
    const long long kvOff = (long long)b * T * kvs + (long long)kvh * D;
    attntc_load(Ks, k + kvOff, kvs, j0, min(ATC_BK, T - j0), ATC_BK, D, 0);
    attntc_load(Vs, v + kvOff, kvs, j0, min(ATC_BK, T - j0), ATC_BK, D, 0);

    int jRow[2], docJ[2];
    float dkAcc[D / 8][4], dvAcc[D / 8][4];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        jRow[hf] = j0 + 16 * warp + g + 8 * hf;
        docJ[hf] = (docs != nullptr && jRow[hf] < T) ? docs[(long long)b * T + jRow[hf]] : 0;
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dkAcc[nd][e] = dvAcc[nd][e] = 0.0f;

    // query i reaches key j iff j <= i + off: the first block holding
    // i = j0 - off
    const int iStart = causal ? max(0, j0 - off) / BQ * BQ : 0;
    for (int h = kvh * grp; h < (kvh + 1) * grp; h++) {
        const long long qOff = (long long)b * T * qs + (long long)h * D;
        for (int i0 = iStart; i0 < T; i0 += BQ) {
            const int nq = min(BQ, T - i0);
            __syncthreads();
            attntc_load(Qs, q + qOff, qs, i0, nq, BQ, D, 0);
            attntc_load(Os, dout + qOff, qs, i0, nq, BQ, D, 0);
            attntc_load(Qt, q + qOff, qs, i0, nq, BQ, D, 1);
            attntc_load(Ot, dout + qOff, qs, i0, nq, BQ, D, 1);
            for (int r = threadIdx.x; r < BQ; r += ATC_THREADS) {
                const int i = i0 + r;
                const long long at = ((long long)b * HQ + h) * T + i;
                Ls[r] = i < T ? lse[at] : -INFINITY;
                Ds[r] = i < T ? delta[at] : 0.0f;
                Dq[r] = (docs != nullptr && i < T) ? docs[(long long)b * T + i] : 0;
                Rk[r] = dropout ? attntc_row_key(seed, b, firstHead + h, i + qpos) : 0;
            }
            __syncthreads();

            float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            attntc_mma_tile<D / 16, BQ / 8>(s, Ks, LD, 16 * warp, Qs, LD, 0);  // Sᵀ = K·Qᵀ
            attntc_mma_tile<D / 16, BQ / 8>(dp, Vs, LD, 16 * warp, Os, LD, 0); // dPᵀ = V·dOᵀ
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e >> 1, r = 8 * nt + 2 * t + (e & 1), i = i0 + r, j = jRow[hf];
                    const bool ok = i < T && j < T && Ls[r] != -INFINITY &&
                                    attntc_allowed(causal, i + off, j, Dq[r], docJ[hf]);
                    const float p = ok ? expf(scale * s[nt][e] - Ls[r]) : 0.0f;
                    const float z = dropout ? attntc_keep(Rk[r], j + kpos, thr, dscale) : 1.0f;
                    s[nt][e] = p * (z * dp[nt][e] - Ds[r]) * scale; // dSᵀ
                    dp[nt][e] = p * z;                               // (P·Z)ᵀ
                }
            attntc_mma_regs<BQ / 16, D / 8>(dvAcc, dp, Ot, LDT); // dV += (P·Z)ᵀ·dO
            attntc_mma_regs<BQ / 16, D / 8>(dkAcc, s, Qt, LDT);  // dK += dSᵀ·Q
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int j = jRow[hf];
        if (j >= T) continue;
        float* dkr = dk + kvOff + (long long)j * kvs;
        float* dvr = dv + kvOff + (long long)j * kvs;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            const int d = 8 * nd + 2 * t;
            dkr[d] += dkAcc[nd][2 * hf];
            dkr[d + 1] += dkAcc[nd][2 * hf + 1];
            dvr[d] += dvAcc[nd][2 * hf];
            dvr[d + 1] += dvAcc[nd][2 * hf + 1];
        }
    }
}

#define ATC_DKV_KERNEL(NAME, D, BQ)                                                                                   \
    extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1)                                                      \
        NAME(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,                 \
             const float* lse, const float* delta, const int32_t* docs, int T, int HQ, int HKV, float scale,          \
             int causal, int dropout, uint32_t thr, float dscale, uint64_t seed, int firstHead, int qpos, int kpos) { \
        attntc_bwd_dkv<D, BQ>(dk, dv, dout, q, k, v, lse, delta, docs, T, HQ, HKV, scale, causal, dropout, thr,      \
                              dscale, seed, firstHead, qpos, kpos);                                                   \
    }

ATC_DKV_KERNEL(attntc_bwd_dkv_d64_bf16, 64, 64)
ATC_DKV_KERNEL(attntc_bwd_dkv_d128_bf16, 128, 32)
