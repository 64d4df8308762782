// Strided copies of the CUDA backend (tensor/cuda_backend_elem.go):
// CopyStrided's gather (strided view → dense) and scatter (dense → strided
// view), by element size, and ScatterAddStrided's accumulation.
//
// A view's geometry comes as 8 sizes and 8 strides (in elements), its dims
// right-aligned with leading size-1 padding: the Go side drops size-1 dims
// and merges dims that continue each other first. Element i of the dense
// side is the view's element whose row-major index is i.

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

#define GEOM_PARAMS                                                                                      \
    long long n0, long long n1, long long n2, long long n3, long long n4, long long n5, long long n6,     \
        long long n7, long long s0, long long s1, long long s2, long long s3, long long s4, long long s5, \
        long long s6, long long s7

// div_fast returns i / n for i >= 0, n > 0, dividing in 32 bits when both
// fit: GPUs emulate 64-bit division in several times the instructions,
// which would bound index-heavy kernels (strided copies) well below
// memory bandwidth.
__host__ __device__ __forceinline__ long long div_fast(long long i, long long n) {
    if (((unsigned long long)i | (unsigned long long)n) <= 0xFFFFFFFFull) {
        return (long long)((unsigned int)i / (unsigned int)n);
    }
    return i / n;
}

// view_offset returns the storage offset (in elements, from the view's
// element 0) of the view's element with row-major index i.
__host__ __device__ __forceinline__ long long view_offset(long long i, const long long sh[8], const long long st[8]) {
    long long off = 0;
#pragma unroll
    for (int d = 7; d >= 0; d--) {
        if (sh[d] != 1) {
            const long long q = div_fast(i, sh[d]);
            off += (i - q * sh[d]) * st[d];
            i = q;
        }
    }
    return off;
}

#define VIEW_OFFSET(off, i)                                                 \
    const long long sh[8] = {n0, n1, n2, n3, n4, n5, n6, n7};               \
    const long long st[8] = {s0, s1, s2, s3, s4, s5, s6, s7};               \
    const long long off = view_offset((i), sh, st);

// dst[i] = src[view offset of i]: a strided view into a dense tensor.
#define GATHER(name, T)                                                                               \
    extern "C" __global__ void name(T* __restrict__ dst, const T* __restrict__ src, long long n, GEOM_PARAMS) { \
        GRID_STRIDE(i, n) {                                                                           \
            VIEW_OFFSET(off, i)                                                                       \
            dst[i] = src[off];                                                                        \
        }                                                                                             \
    }

// dst[view offset of i] = src[i]: a dense tensor into a strided view.
#define SCATTER(name, T)                                                                              \
    extern "C" __global__ void name(T* __restrict__ dst, const T* __restrict__ src, long long n, GEOM_PARAMS) { \
        GRID_STRIDE(i, n) {                                                                           \
            VIEW_OFFSET(off, i)                                                                       \
            dst[off] = src[i];                                                                        \
        }                                                                                             \
    }

GATHER(copy_gather_u16, uint16_t)
GATHER(copy_gather_u32, uint32_t)
GATHER(copy_gather_u64, unsigned long long)
SCATTER(copy_scatter_u16, uint16_t)
SCATTER(copy_scatter_u32, uint32_t)
SCATTER(copy_scatter_u64, unsigned long long)

// dst[base + view offset of i] += g[i]. Where two elements of the view
// share storage (atomic != 0: a broadcast or overlapping view) the adds
// are atomic, in no fixed order.
extern "C" __global__ void copy_scatter_add_f32(float* dst, const float* __restrict__ g, long long base, int atomic, long long n, GEOM_PARAMS) {
    if (atomic) {
        GRID_STRIDE(i, n) {
            VIEW_OFFSET(off, i)
            atomicAdd(&dst[base + off], g[i]);
        }
    } else {
        GRID_STRIDE(i, n) {
            VIEW_OFFSET(off, i)
            dst[base + off] += g[i];
        }
    }
}
