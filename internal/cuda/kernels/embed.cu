// Embedding lookups of the CUDA backend (tensor/cuda_backend_embed.go):
// rows of a table (rows, c) gathered by int32 ids, and the backward
// scatter-add (atomic: ids repeat, so the order of the adds, and the last
// bits of a repeated row's gradient, vary from run to run).

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// div_fast returns i / n for i >= 0, n > 0, dividing in 32 bits when both
// fit: GPUs emulate 64-bit division in several times the instructions,
// which would bound index-heavy kernels (strided copies) well below
// memory bandwidth.
__device__ __forceinline__ long long div_fast(long long i, long long n) {
    if (((unsigned long long)i | (unsigned long long)n) <= 0xFFFFFFFFull) {
        return (long long)((unsigned int)i / (unsigned int)n);
    }
    return i / n;
}

// out[i, k] = table[ids[i] - start, k] for ids in [start, start+rows),
// else 0 (a vocab-parallel rank's share; start 0 for the whole table, where
// the op has checked the ids and the bound only keeps a bad id from
// faulting). total = len(ids)·c.
extern "C" __global__ void embed_fwd_f32(float* __restrict__ out, const float* __restrict__ table, const int* __restrict__ ids, long long total, long long c, long long start, long long rows) {
    GRID_STRIDE(e, total) {
        const long long i = div_fast(e, c), k = e - i * c;
        const long long j = (long long)ids[i] - start;
        out[e] = (j >= 0 && j < rows) ? table[j * c + k] : 0.0f;
    }
}

// dtable[ids[i] - start, k] += dout[i, k] for ids in [start, start+rows).
extern "C" __global__ void embed_bwd_f32(float* dtable, const float* __restrict__ dout, const int* __restrict__ ids, long long total, long long c, long long start, long long rows) {
    GRID_STRIDE(e, total) {
        const long long i = div_fast(e, c), k = e - i * c;
        const long long j = (long long)ids[i] - start;
        if (j >= 0 && j < rows) atomicAdd(&dtable[j * c + k], dout[e]);
    }
}
