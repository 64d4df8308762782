// Dropout masks of the CUDA backend (tensor/cuda_backend_reduce.go): the
// same Philox-4x32-10 stream as tensor.RNG, so a GPU run draws the masks a
// CPU run does, bit for bit.

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// philox4x32_10 is tensor.philox: ten rounds on the counter ctr with the
// key bumped by the Weyl constants after each.
__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint32_t k0, uint32_t k1) {
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

// dropout_block writes mask[4b+j] (j < 4, 4b+j < n): 0 when word j of
// Philox block offset+b is below thr (dropped), else keep.
__host__ __device__ __forceinline__ void dropout_block(float* mask, long long n, long long b, uint32_t k0, uint32_t k1, unsigned long long offset, uint32_t thr, float keep) {
    const unsigned long long i = offset + (unsigned long long)b;
    const uint4 w = philox4x32_10(make_uint4((uint32_t)i, (uint32_t)(i >> 32), 0u, 0u), k0, k1);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    const long long e = 4 * b;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (e + j < n) mask[e + j] = words[j] < thr ? 0.0f : keep;
    }
}

// tensor.RNG.DropoutMask from state (key, offset) over n elements, one
// Philox block per 4; thr = uint32(p·2³²) and keep = 1/(1-p) computed by
// the host as the CPU computes them.
extern "C" __global__ void dropout_mask_f32(float* __restrict__ mask, long long n, unsigned int k0, unsigned int k1, unsigned long long offset, unsigned int thr, float keep) {
    const long long blocks = (n + 3) / 4;
    GRID_STRIDE(b, blocks) { dropout_block(mask, n, b, k0, k1, offset, thr, keep); }
}
