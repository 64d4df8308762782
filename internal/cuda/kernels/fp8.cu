// FP8 quantization kernels for cuBLASLt's FP8 GEMM (Transformer Engine's
// cast path, as package internal/fp8 emulates it): the amax of a tensor,
// the tensorwise scale from it (TE's compute_scale_from_amax), the delayed
// recipe's amax-history update (TE's amax_and_scale_update), and casts of
// float32 to E4M3/E5M2 codes, straight or transposed (cuBLASLt's FP8
// matmul wants both operands with the reduced dimension contiguous).
//
// The cast is fp8.Encode bit for bit, in integer arithmetic on the float32
// bits: round to nearest even, magnitudes at or beyond the largest finite
// value (infinities included) saturate to it with their sign, NaN gives
// 0x7F, signed zeros keep their sign. CUDA's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE does the same in hardware from sm_89 only; this compiles
// for the sm_80 PTX as well. testdata/fp8_host.cc runs these functions on
// the host against fp8.Encode (TestFP8HostEncode).
//
// Tensors are float32 (the CUDA backend's); bf16 != 0 rounds each value
// to bfloat16 first (Megatron's --bf16 activations and weights, as
// tensor.FP8Linear's BF16Activations/BF16Weight). Scales live on the
// device (scale[0], scaleInv[0]) so that no step reads them back.

#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// FP8 formats, as the kernels' fmt argument: internal/fp8's Format values.
#define FP8_E4M3 1
#define FP8_E5M2 2

__host__ __device__ __forceinline__ uint32_t fp8_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

__host__ __device__ __forceinline__ float fp8_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

// fp8_round_bf16 is x rounded to bfloat16 (elem.cu's bf16_from_f32 and
// back: internal/cpu.RoundBF16, NaNs quieted with their sign).
__host__ __device__ __forceinline__ float fp8_round_bf16(float x) {
    uint32_t b = fp8_f32_bits(x);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
        return fp8_f32_from_bits(((b >> 16) | 0x0040u) << 16);
    }
    b += 0x7FFFu + ((b >> 16) & 1u);
    return fp8_f32_from_bits(b & 0xFFFF0000u);
}

// fp8_encode is fmt's code of x (fp8.Format.Encode).
__host__ __device__ __forceinline__ uint8_t fp8_encode(float x, int fmt) {
    // mb: mantissa bits; bias; maxBits: the float32 bits of the largest
    // finite value; maxCode: its code; minNormal: the float32 bits of the
    // smallest normal value.
    const int e5 = fmt == FP8_E5M2;
    const uint32_t mb = e5 ? 2 : 3, bias = e5 ? 15 : 7;
    const uint32_t maxBits = e5 ? 0x47600000u : 0x43E00000u;  // 57344, 448
    const uint32_t minNormal = e5 ? 0x38800000u : 0x3C800000u;  // 2^-14, 2^-6
    const uint8_t maxCode = e5 ? 0x7B : 0x7E;
    const uint32_t b = fp8_f32_bits(x);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
    const uint32_t mag = b & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return 0x7F;  // NaN
    if (mag >= maxBits) return sign | maxCode;
    if (mag >= minNormal) {
        // normal: round the mantissa to mb bits, ties to even; a carry
        // moves into the exponent, which stays below the largest value's
        const uint32_t drop = 23 - mb;
        uint32_t r = (mag + ((1u << (drop - 1)) - 1u) + ((mag >> drop) & 1u)) >> drop;
        return sign | (uint8_t)(r - ((127u - bias) << mb));
    }
    // subnormal: n = |x| / 2^(1-bias-mb), rounded to nearest even; |x| is
    // sig·2^(e-150) (sig with its leading bit; e at least 1)
    const uint32_t e = mag >> 23;
    const uint32_t sig = e ? (mag & 0x7FFFFFu) | 0x800000u : mag;
    const uint32_t s = (1u - bias - mb) + 150u - (e ? e : 1u);  // the shift, at least 20
    if (s > 25) return sign;  // |x| < 2^24·2^-s ≤ half the smallest subnormal
    uint32_t n = sig >> s;
    const uint32_t rem = sig & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (n & 1u))) n++;
    return sign | (uint8_t)n;  // n = 1<<mb is the smallest normal's code
}

// fp8_tensorwise_scale is fp8.TensorwiseScale (TE's
// compute_scale_from_amax: epsilon 0, no power-of-2 rounding, the largest
// float32 when fmax/amax overflows; 1 for an amax of 0, Inf or NaN).
__host__ __device__ __forceinline__ float fp8_tensorwise_scale(float amax, float fmax) {
    const uint32_t a = fp8_f32_bits(amax) & 0x7FFFFFFFu;
    if (a == 0 || a >= 0x7F800000u) return 1.0f;  // amax ≥ 0: 0, Inf, NaN
    float scale = fmax / amax;
    if ((fp8_f32_bits(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = 3.402823466e38f;
    return scale;
}

// fp8_delayed_update is fp8.History.Update on hist[0..n): the amax is
// hist[0] (mostRecent) or the largest of the history (NaNs skipped), the
// history rolls one place toward its start and hist[0] restarts at 0, the
// scale becomes scaledMax/amax when the amax is finite and positive and
// stays otherwise, the largest float32 when that overflows.
__host__ __device__ __forceinline__ void fp8_delayed_update(float* hist, float* scale, int n, float scaledMax, int mostRecent) {
    const float last = hist[0];
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = i < n - 1 ? hist[i + 1] : last;
        if (a > amax) amax = a;
        if (i > 0) hist[i] = a;
    }
    hist[0] = 0.0f;
    if (mostRecent) amax = last;
    const uint32_t ab = fp8_f32_bits(amax);
    if (ab < 0x7F800000u && ab != 0) {  // finite and positive (amax ≥ 0 or NaN)
        *scale = scaledMax / amax;
    }
    if ((fp8_f32_bits(*scale) & 0x7FFFFFFFu) == 0x7F800000u) *scale = 3.402823466e38f;
}

#ifdef __CUDACC__

// amax[0] = max(amax[0], max |x[i]|) (bf16: of x rounded to bfloat16),
// NaNs skipped (fmaxf, as fp8.Amax). Non-negative floats order as their
// bits, so an atomic integer maximum gives the same value in any order:
// the result is deterministic. amax[0] starts at 0 for a tensor's own
// amax, or holds the delayed recipe's History[0] (fp8.History.Observe).
// Blocks of at most 1024 threads, a multiple of 32.
extern "C" __global__ void fp8_amax_f32(float* amax, const float* __restrict__ x, long long n, int bf16) {
    float m = 0.0f;
    GRID_STRIDE(i, n) {
        float v = x[i];
        if (bf16) v = fp8_round_bf16(v);
        m = fmaxf(m, fabsf(v));  // fmaxf(m, NaN) = m
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m > 0.0f) atomicMax((unsigned int*)amax, __float_as_uint(m));
}

// scale[0] = fp8_tensorwise_scale(amax[0], fmax), scaleInv[0] = 1/scale
// (fp8.ScaleInv). One thread.
extern "C" __global__ void fp8_scale_tensorwise(float* scale, float* scaleInv, const float* amax, float fmax) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const float s = fp8_tensorwise_scale(amax[0], fmax);
    scale[0] = s;
    scaleInv[0] = 1.0f / s;
}

// scale[0] = s, scaleInv[0] = inv: the delayed recipe's scale, kept by the
// host's history (fp8.History.Scale) and its inverse (fp8.ScaleInv),
// written on the stream before the cast that reads them. One thread.
extern "C" __global__ void fp8_scale_set(float* scale, float* scaleInv, float s, float inv) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    scale[0] = s;
    scaleInv[0] = inv;
}

// The delayed recipe's update of one history (hist[0..n)) and its scale,
// scaleInv[0] = 1/scale (fp8.History.Update). One thread.
extern "C" __global__ void fp8_delayed_update_f32(float* hist, float* scale, float* scaleInv, int n, float scaledMax, int mostRecent) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    fp8_delayed_update(hist, scale, n, scaledMax, mostRecent);
    scaleInv[0] = 1.0f / scale[0];
}

// out[i] = fp8_encode(x[i]·scale[0]) (fp8.Quantize's product, rounded
// once in float32).
extern "C" __global__ void fp8_cast_f32(uint8_t* __restrict__ out, const float* __restrict__ x, const float* scale, long long n, int fmt, int bf16) {
    const float s = scale[0];
    GRID_STRIDE(i, n) {
        float v = x[i];
        if (bf16) v = fp8_round_bf16(v);
        out[i] = fp8_encode(__fmul_rn(v, s), fmt);
    }
}

// out (cols, rows) = the cast of x (rows, cols) transposed: out[j·rows+i]
// = fp8_encode(x[i·cols+j]·scale[0]). Blocks of 32×8 threads over 32×32
// tiles: grid (ceil(cols/32), ceil(rows/32)), the y dimension at most
// 65535 (callers loop over row chunks beyond, offsetting x and out).
extern "C" __global__ void fp8_cast_transpose_f32(uint8_t* __restrict__ out, const float* __restrict__ x, const float* scale, long long rows, long long cols, int fmt, int bf16) {
    __shared__ uint8_t tile[32][33];
    const float s = scale[0];
    const long long c0 = (long long)blockIdx.x * 32, r0 = (long long)blockIdx.y * 32;
    for (int k = threadIdx.y; k < 32; k += 8) {
        const long long r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            float v = x[r * cols + c];
            if (bf16) v = fp8_round_bf16(v);
            tile[k][threadIdx.x] = fp8_encode(__fmul_rn(v, s), fmt);
        }
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += 8) {
        const long long c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
}

#endif  // __CUDACC__
