// attntc_host runs attntc.cu's kernels on the host for TestAttntcHostKernels
// (attntc_host_test.go): every CUDA thread of a block is a host thread,
// __syncthreads and the warp shuffles are barriers over them, and mma.sync
// is emulated from the PTX ISA's m16n8k16 fragment layouts (each warp's 32
// lanes publish their registers, every lane rebuilds A (16×16) and B
// (16×8) and takes its own four results). The kernels' source runs
// unchanged (attntc.cu's ATTNTC_HOST hooks replace its two PTX asm
// statements), so their tile, fragment and shared-memory index math is
// checked against the CPU backend without a GPU; what the GPU itself adds
// (the PTX compiler, the tensor cores' accumulation order) is not.
// Built by the test with g++.
//
//	attntc_host fwd B T HQ HKV D scale causal p seed firstHead qpos kpos accumulate docs
//	    stdin: q, k, v, out, lse (float32), docs (int32, if docs) → stdout: out, lse
//	attntc_host bwd B T HQ HKV D scale causal p seed firstHead qpos kpos docs
//	    stdin: q, k, v, dout, out, lse, dq, dk, dv, docs → stdout: dq, dk, dv
// Little-endian binary, the (B, T, H, D) and (B, HQ, T) layouts of attntc.cu.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <thread>
#include <vector>

#define HOST_HARNESS_NAME "attntc_host"
#include "host_harness.h"

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define __align__(n)
#define __launch_bounds__(a, b)

struct attntc_dim3 {
    int x, y, z;
};
static thread_local attntc_dim3 threadIdx, blockIdx;

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline void __trap() {
    fprintf(stderr, "attntc_host: __trap (dynamic shared memory below the kernel's need)\n");
    abort();
}

static barrier* block_barrier;
static barrier* warp_barrier[4];
static inline void __syncthreads() { block_barrier->wait(); }

static float shfl_buf[4][32];
static inline float __shfl_xor_sync(unsigned, float x, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_barrier[w]->wait(); // the previous shuffle's reads are done
    shfl_buf[w][l] = x;
    warp_barrier[w]->wait();
    return shfl_buf[w][l ^ o];
}

struct mma_regs {
    uint32_t a[4], b[2];
};
static mma_regs mma_buf[4][32];

static inline float bf16_lo(uint32_t r) {
    uint32_t u = r << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float bf16_hi(uint32_t r) {
    uint32_t u = r & 0xFFFF0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling lane
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
// g = lane / 4, t = lane % 4; A a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
// a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B b0 = (k 2t..2t+1, n g),
// b1 = (k 2t+8.., n g); C/D c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..).
// The lower k (or column) of a pair is the register's low half.
static void attntc_host_mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_barrier[w]->wait();
    mma_buf[w][l] = mma_regs{{a0, a1, a2, a3}, {b0, b1}};
    warp_barrier[w]->wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, t = L & 3;
        const mma_regs& r = mma_buf[w][L];
        A[g][2 * t] = bf16_lo(r.a[0]), A[g][2 * t + 1] = bf16_hi(r.a[0]);
        A[g + 8][2 * t] = bf16_lo(r.a[1]), A[g + 8][2 * t + 1] = bf16_hi(r.a[1]);
        A[g][2 * t + 8] = bf16_lo(r.a[2]), A[g][2 * t + 9] = bf16_hi(r.a[2]);
        A[g + 8][2 * t + 8] = bf16_lo(r.a[3]), A[g + 8][2 * t + 9] = bf16_hi(r.a[3]);
        B[2 * t][g] = bf16_lo(r.b[0]), B[2 * t + 1][g] = bf16_hi(r.b[0]);
        B[2 * t + 8][g] = bf16_lo(r.b[1]), B[2 * t + 9][g] = bf16_hi(r.b[1]);
    }
    const int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = c[e]; // the 16 products are exact; one rounding
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * (double)B[k][col];
        c[e] = (float)s;
    }
}

static uint32_t dyn_smem;
static inline uint32_t attntc_host_dynamic_smem() { return dyn_smem; }

alignas(16) static uint16_t atc_smem[1 << 17];

#define ATTNTC_HOST 1
#include "../attntc.cu"

// launch runs kernel over the grid, one block after the other, 128 host
// threads per block, shared memory filled with NaN bit patterns first (a
// read of an unwritten element shows).
static void launch(int gx, int gy, int gz, uint32_t smem, const std::function<void()>& kernel) {
    if (smem > sizeof(atc_smem)) {
        fprintf(stderr, "attntc_host: %u bytes of shared memory\n", smem);
        exit(2);
    }
    dyn_smem = smem;
    for (int z = 0; z < gz; z++)
        for (int y = 0; y < gy; y++)
            for (int x = 0; x < gx; x++) {
                memset(atc_smem, 0xFF, sizeof(atc_smem));
                barrier blk(ATC_THREADS);
                barrier w0(32), w1(32), w2(32), w3(32);
                block_barrier = &blk;
                warp_barrier[0] = &w0, warp_barrier[1] = &w1, warp_barrier[2] = &w2, warp_barrier[3] = &w3;
                std::vector<std::thread> ts;
                for (int tid = 0; tid < ATC_THREADS; tid++)
                    ts.emplace_back([&, tid] {
                        threadIdx = {tid, 0, 0};
                        blockIdx = {x, y, z};
                        kernel();
                    });
                for (auto& t : ts) t.join();
            }
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const bool fwd = strcmp(argv[1], "fwd") == 0;
    if (argc != (fwd ? 16 : 15)) {
        fprintf(stderr, "attntc_host: %d arguments\n", argc);
        return 2;
    }
    int a = 2;
    const int B = atoi(argv[a++]), T = atoi(argv[a++]), HQ = atoi(argv[a++]), HKV = atoi(argv[a++]), D = atoi(argv[a++]);
    const float scale = strtof(argv[a++], 0);
    const int causal = atoi(argv[a++]);
    const double p = strtod(argv[a++], 0);
    const uint64_t seed = strtoull(argv[a++], 0, 0);
    const int firstHead = atoi(argv[a++]), qpos = atoi(argv[a++]), kpos = atoi(argv[a++]);
    const int accumulate = fwd ? atoi(argv[a++]) : 0;
    const int hasDocs = atoi(argv[a++]);
    // internal/cpu's dropThreshold and dropScale (tensor/cuda_backend_attn.go)
    const int dropout = p > 0;
    const uint32_t thr = (uint32_t)(p * 4294967296.0);
    const float dscale = (float)(1 / (1 - p));
    const size_t nq = (size_t)B * T * HQ * D, nkv = (size_t)B * T * HKV * D, nl = (size_t)B * HQ * T;
    std::vector<float> q = readN<float>(nq), k = readN<float>(nkv), v = readN<float>(nkv);
    if (fwd) {
        std::vector<float> out = readN<float>(nq), lse = readN<float>(nl);
        std::vector<int32_t> docs = readN<int32_t>(hasDocs ? (size_t)B * T : 0);
        const int32_t* dp = hasDocs ? docs.data() : nullptr;
        auto run = [&](auto kern, uint32_t smem) {
            launch((T + ATC_BQ - 1) / ATC_BQ, HQ, B, smem, [&] {
                kern(out.data(), lse.data(), q.data(), k.data(), v.data(), dp, T, HQ, HKV, scale, causal, dropout, thr,
                     dscale, seed, firstHead, qpos, kpos, accumulate);
            });
        };
        if (D == 64) run(attntc_fwd_d64_bf16, ATC_FWD_SMEM(64));
        else run(attntc_fwd_d128_bf16, ATC_FWD_SMEM(128));
        writeAll(out);
        writeAll(lse);
        return 0;
    }
    std::vector<float> dout = readN<float>(nq), out = readN<float>(nq), lse = readN<float>(nl);
    std::vector<float> dq = readN<float>(nq), dk = readN<float>(nkv), dv = readN<float>(nkv);
    std::vector<int32_t> docs = readN<int32_t>(hasDocs ? (size_t)B * T : 0);
    const int32_t* dp = hasDocs ? docs.data() : nullptr;
    // delta = rowsum(dout∘out), attn.cu's attn_bwd_delta_f32 (float32)
    std::vector<float> delta(nl);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++)
            for (int h = 0; h < HQ; h++) {
                float s = 0;
                const size_t o = (((size_t)b * T + i) * HQ + h) * D;
                for (int d = 0; d < D; d++) s += dout[o + d] * out[o + d];
                delta[((size_t)b * HQ + h) * T + i] = s;
            }
    auto runDq = [&](auto kern, uint32_t smem) {
        launch((T + ATC_BQ - 1) / ATC_BQ, HQ, B, smem, [&] {
            kern(dq.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dp, T, HQ, HKV, scale,
                 causal, dropout, thr, dscale, seed, firstHead, qpos, kpos);
        });
    };
    auto runDkv = [&](auto kern, uint32_t smem) {
        launch((T + ATC_BK - 1) / ATC_BK, HKV, B, smem, [&] {
            kern(dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dp, T, HQ,
                 HKV, scale, causal, dropout, thr, dscale, seed, firstHead, qpos, kpos);
        });
    };
    if (D == 64) {
        runDq(attntc_bwd_dq_d64_bf16, ATC_DQ_SMEM(64));
        runDkv(attntc_bwd_dkv_d64_bf16, ATC_DKV_SMEM(64, 64));
    } else {
        runDq(attntc_bwd_dq_d128_bf16, ATC_DQ_SMEM(128));
        runDkv(attntc_bwd_dkv_d128_bf16, ATC_DKV_SMEM(128, 32));
    }
    writeAll(dq);
    writeAll(dk);
    writeAll(dv);
    return 0;
}
