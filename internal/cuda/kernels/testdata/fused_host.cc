// fused_host runs fused.cu's residual add + norm kernel
// (fused_bias_dropout_add_norm_f32) on the host for TestFusedAddNormHost
// (fused_host_test.go): every CUDA thread of a block is a host thread,
// __syncthreads and the warp shuffles are barriers over them, blocks run
// one after the other, shared memory starts as NaN bit patterns. The
// kernel's source runs unchanged; built by the test with g++ without
// fused multiply-adds.
//
//	fused_host addnorm n c blocks threads dropout k0 k1 offset thr keepbits eps rms hasBias hasNormBias
//	    stdin: residual, y (n·c float32), b (c, if hasBias), w (c), nb (c, if hasNormBias)
//	    → stdout: sum, out (n·c), mean (n, unless rms), rstd (n)
// Little-endian binary.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <thread>
#include <vector>

#define HOST_HARNESS_NAME "fused_host"
#include "host_harness.h"

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(a)

struct fh_dim3 {
    unsigned x, y, z;
};
static thread_local fh_dim3 threadIdx, blockIdx;
static fh_dim3 blockDim, gridDim;

struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }

static barrier* block_barrier;
static barrier* warp_barrier[8];
static inline void __syncthreads() { block_barrier->wait(); }

static double shfl_buf[8][32];
static inline double __shfl_xor_sync(unsigned, double x, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_barrier[w]->wait();
    shfl_buf[w][l] = x;
    warp_barrier[w]->wait();
    return shfl_buf[w][l ^ o];
}

// the kernel's dynamic shared row: one block at a time, so one buffer
static std::vector<float> fh_row;
#define FUSED_HOST_ROW 1

#include "../fused.cu"

int main(int argc, char** argv) {
    if (argc != 16 || strcmp(argv[1], "addnorm") != 0) {
        fprintf(stderr, "fused_host: bad arguments\n");
        return 2;
    }
    int a = 2;
    const long long n = atoll(argv[a++]), c = atoll(argv[a++]);
    const int blocks = atoi(argv[a++]), threads = atoi(argv[a++]), dropout = atoi(argv[a++]);
    const unsigned k0 = strtoul(argv[a++], 0, 0), k1 = strtoul(argv[a++], 0, 0);
    const unsigned long long offset = strtoull(argv[a++], 0, 0);
    const unsigned thr = strtoul(argv[a++], 0, 0);
    uint32_t keepBits = strtoul(argv[a++], 0, 0);
    float keep;
    memcpy(&keep, &keepBits, 4);
    const float eps = strtof(argv[a++], 0);
    const int rms = atoi(argv[a++]), hasBias = atoi(argv[a++]), hasNormBias = atoi(argv[a++]);
    auto residual = readN<float>(n * c), y = readN<float>(n * c);
    std::vector<float> b, nb;
    if (hasBias) b = readN<float>(c);
    auto w = readN<float>(c);
    if (hasNormBias) nb = readN<float>(c);
    std::vector<float> sum(n * c), out(n * c), mean(n), rstd(n);
    fh_row.assign(c, 0.0f);
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = {(unsigned)blocks, 1, 1};
    for (int x = 0; x < blocks; x++) {
        for (auto& v : fh_row) memset(&v, 0xFF, 4);
        barrier blk(threads);
        std::vector<barrier*> warps;
        for (int i = 0; i < threads / 32; i++) warps.push_back(new barrier(32)), warp_barrier[i] = warps.back();
        block_barrier = &blk;
        std::vector<std::thread> ts;
        for (int tid = 0; tid < threads; tid++)
            ts.emplace_back([&, tid] {
                threadIdx = {(unsigned)tid, 0, 0};
                blockIdx = {(unsigned)x, 0, 0};
                fused_bias_dropout_add_norm_f32(sum.data(), out.data(), rms ? nullptr : mean.data(), rstd.data(), residual.data(), y.data(),
                                                hasBias ? b.data() : nullptr, w.data(), hasNormBias ? nb.data() : nullptr, n, c, dropout, k0,
                                                k1, offset, thr, keep, eps);
            });
        for (auto& t : ts) t.join();
        for (auto* p : warps) delete p;
    }
    writeAll(sum);
    writeAll(out);
    if (!rms) writeAll(mean);
    writeAll(rstd);
    return 0;
}
