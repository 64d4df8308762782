// Token sampling on the device (tensor/sampling_ops.go): the greedy draw.
// Other draws (temperature, top-k, top-p, log-probabilities) run on the
// host in the CUDA backend (tensor/cuda_backend_decode.go), with the CPU
// backend's code, for the same draws bit for bit.

#include <stdint.h>

#define SAMPLE_THREADS 256

// sample_better reports whether candidate (v, i) goes before (bv, bi) in
// the argmax order: a larger value, or an equal one at a lower index;
// index -1 is no candidate (every value so far NaN).
__device__ __forceinline__ bool sample_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

// sample_argmax_f32 writes into ids[k] the greedy token of logits row
// rows[k] (V columns, the first vocab the vocabulary): as the CPU's
// argmax, the first index of the largest value, where a NaN never wins
// over an earlier value (a NaN in column 0 wins outright, as the CPU's
// loop, which starts from column 0, keeps it). Grid (draws), 256 threads.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_argmax_f32(int32_t* ids, const float* logits, const int32_t* rows, int V, int vocab) {
    const int k = blockIdx.x, tid = threadIdx.x;
    const float* x = logits + (long long)rows[k] * V;
    float bv = 0.0f;
    int bi = -1;
    for (int i = tid; i < vocab; i += blockDim.x) {
        const float v = x[i];
        if (v == v && (bi < 0 || v > bv)) { // increasing i: equal values keep the earlier
            bv = v;
            bi = i;
        }
    }
    __shared__ float sv[SAMPLE_THREADS];
    __shared__ int si[SAMPLE_THREADS];
    sv[tid] = bv;
    si[tid] = bi;
    __syncthreads();
    for (int s = SAMPLE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s && sample_better(sv[tid + s], si[tid + s], sv[tid], si[tid])) {
            sv[tid] = sv[tid + s];
            si[tid] = si[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        int best = si[0];
        if (vocab == 0 || x[0] != x[0] || best < 0) best = 0;
        ids[k] = best;
    }
}
