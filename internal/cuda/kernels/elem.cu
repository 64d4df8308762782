// Elementwise kernels of the CUDA backend (tensor/cuda_backend_elem.go):
// arithmetic, fills, dtype conversions and activations. Each matches the
// CPU backend's float32 formula (tensor/cpu_backend*.go, internal/cpu)
// operation for operation; only exp/erf's last bits and FMA contraction
// differ. Element counts are 64-bit; loops are grid-stride.

#include <stdint.h>
#include <string.h>

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

// The tensor.DType codes.
#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2
#define DT_I32 3
#define DT_I64 4

// out = a + b, b's nb elements repeating along a's leading dims.
extern "C" __global__ void elem_add_f32(float* out, const float* a, const float* b, long long n, long long nb) {
    if (nb == n) {
        GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
    } else {
        GRID_STRIDE(i, n) { out[i] = a[i] + b[i - div_fast(i, nb) * nb]; }
    }
}

// out = a * b, broadcast as elem_add_f32.
extern "C" __global__ void elem_mul_f32(float* out, const float* a, const float* b, long long n, long long nb) {
    if (nb == n) {
        GRID_STRIDE(i, n) { out[i] = a[i] * b[i]; }
    } else {
        GRID_STRIDE(i, n) { out[i] = a[i] * b[i - div_fast(i, nb) * nb]; }
    }
}

// y += alpha * x.
extern "C" __global__ void elem_axpy_f32(float* y, float alpha, const float* x, long long n) {
    GRID_STRIDE(i, n) { y[i] += alpha * x[i]; }
}

// out = alpha * x (out may alias x).
extern "C" __global__ void elem_scale_f32(float* out, float alpha, const float* x, long long n) {
    GRID_STRIDE(i, n) { out[i] = alpha * x[i]; }
}

// Fills with a bit pattern the host computed (tensor.Fill's conversion of
// the value to the dtype), by element size.
extern "C" __global__ void elem_fill_u16(uint16_t* p, unsigned int v, long long n) {
    GRID_STRIDE(i, n) { p[i] = (uint16_t)v; }
}

extern "C" __global__ void elem_fill_u32(uint32_t* p, unsigned int v, long long n) {
    GRID_STRIDE(i, n) { p[i] = v; }
}

extern "C" __global__ void elem_fill_u64(unsigned long long* p, unsigned long long v, long long n) {
    GRID_STRIDE(i, n) { p[i] = v; }
}

// Bit casts that also compile for the host (tests run the conversions
// there against internal/half).
__host__ __device__ __forceinline__ uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

__host__ __device__ __forceinline__ float f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

// The conversions of internal/half, bit for bit (integer arithmetic, so
// NaN payloads, subnormals and ties come out as on the CPU).
__host__ __device__ __forceinline__ uint16_t bf16_from_f32(float f) {
    uint32_t b = f32_bits(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and payload top, quiet
        return (uint16_t)((b >> 16) | 0x0040u);
    }
    b += 0x7FFFu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

__host__ __device__ __forceinline__ float f32_from_bf16(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

__host__ __device__ __forceinline__ uint16_t f16_from_f32(float f) {
    uint32_t b = f32_bits(f);
    uint32_t sign = (b >> 16) & 0x8000u;
    int exp = (int)((b >> 23) & 0xFFu);
    uint32_t mant = b & 0x7FFFFFu;
    if (exp == 0xFF) {
        if (mant != 0) {
            return (uint16_t)(sign | 0x7C00u | 0x0200u | (mant >> 13));
        }
        return (uint16_t)(sign | 0x7C00u);
    }
    int e = exp - 127 + 15;
    if (e >= 0x1F) {
        return (uint16_t)(sign | 0x7C00u);
    }
    if (e <= 0) {
        if (e < -10) {
            return (uint16_t)sign;
        }
        uint32_t m = mant | 0x800000u;
        if (exp == 0) {
            m = mant;
        }
        unsigned shift = (unsigned)(14 - e);
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u) == 1u)) {
            h++;
        }
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) {
        h++;
    }
    return (uint16_t)(sign | h);
}

__host__ __device__ __forceinline__ float f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1Fu;
    uint32_t mant = (uint32_t)h & 0x3FFu;
    if (exp == 0x1F) {
        if (mant != 0) {
            return f32_from_bits(sign | 0x7F800000u | (mant << 13));
        }
        return f32_from_bits(sign | 0x7F800000u);
    }
    if (exp == 0) {
        if (mant == 0) {
            return f32_from_bits(sign);
        }
        float v = (float)mant * (1.0f / 16777216.0f);  // exact: mant·2⁻²⁴
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// Float to integer as Go's conversion on amd64 (CVTTSS2SI): truncation
// toward zero, and the "integer indefinite" minimum for NaN or values out
// of range (CUDA's cvt would saturate instead).
__host__ __device__ __forceinline__ int i32_from_f32(float v) {
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) {
        return (int)0x80000000u;
    }
    return (int)v;
}

__host__ __device__ __forceinline__ long long i64_from_f32(float v) {
    if (!(v >= -9223372036854775808.0f && v < 9223372036854775808.0f)) {
        return (long long)0x8000000000000000ull;
    }
    return (long long)v;
}

// dst = src converted through float32 (tensor.Convert): the source
// widens exactly (ints by value, rounded to nearest), the destination
// narrows as tensor.Float32ToBFloat16/Float32ToFloat16, or truncates to
// an integer. Both contiguous, n elements.
// convert_one converts element i (tensor.Convert's loop body).
__host__ __device__ __forceinline__ void convert_one(void* dst, int dstType, const void* src, int srcType, long long i) {
    float v = 0.0f;
    switch (srcType) {
    case DT_F32: v = ((const float*)src)[i]; break;
    case DT_BF16: v = f32_from_bf16(((const uint16_t*)src)[i]); break;
    case DT_F16: v = f32_from_f16(((const uint16_t*)src)[i]); break;
    case DT_I32: v = (float)((const int*)src)[i]; break;          // round to nearest
    case DT_I64: v = (float)((const long long*)src)[i]; break;    // round to nearest
    }
    switch (dstType) {
    case DT_F32: ((float*)dst)[i] = v; break;
    case DT_BF16: ((uint16_t*)dst)[i] = bf16_from_f32(v); break;
    case DT_F16: ((uint16_t*)dst)[i] = f16_from_f32(v); break;
    case DT_I32: ((int*)dst)[i] = i32_from_f32(v); break;
    case DT_I64: ((long long*)dst)[i] = i64_from_f32(v); break;
    }
}

extern "C" __global__ void elem_convert(void* dst, int dstType, const void* src, int srcType, long long n) {
    GRID_STRIDE(i, n) { convert_one(dst, dstType, src, srcType, i); }
}

// sigmoid as internal/cpu's sigmoidOf: 1/(1+exp(-x)), exact 0 and 1 in
// the tails.
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// sqrt(2/π) and 2·sqrt(2/π) rounded to float32, as Go rounds the constant
// expressions geluTanhK and 2*geluTanhK of internal/cpu.
#define GELU_TANH_K 0.7978845608028654f
#define GELU_TANH_2K 1.5957691216057308f

// out = x·sigmoid(2·sqrt(2/π)·(x+0.044715x³)) = 0.5x(1+tanh(...)).
extern "C" __global__ void elem_gelu_tanh_fwd_f32(float* out, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float s = sigmoid_f32(GELU_TANH_2K * (v + 0.044715f * v * v * v));
        out[i] = v * s;
    }
}

// dx += dout·(s + 2x·s(1-s)·sqrt(2/π)(1+3·0.044715x²)).
extern "C" __global__ void elem_gelu_tanh_bwd_f32(float* dx, const float* dout, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float s = sigmoid_f32(GELU_TANH_2K * (v + 0.044715f * v * v * v));
        dx[i] += dout[i] * (s + 2.0f * v * s * (1.0f - s) * GELU_TANH_K * (1.0f + 0.134145f * v * v));
    }
}

// out = 0.5x(1+erf(x/√2)), in float64 as the CPU's scalar path.
extern "C" __global__ void elem_gelu_erf_fwd_f32(float* out, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        out[i] = (float)(0.5 * v * (1.0 + erf(v / 1.4142135623730951)));
    }
}

// dx += dout·(Φ(x) + x·φ(x)), the derivative in float64.
extern "C" __global__ void elem_gelu_erf_bwd_f32(float* dx, const float* dout, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        double g = 0.5 * (1.0 + erf(v / 1.4142135623730951)) + v * 0.3989422804014327 * exp(-0.5 * v * v);
        dx[i] += dout[i] * (float)g;
    }
}

// out = x·sigmoid(x).
extern "C" __global__ void elem_silu_fwd_f32(float* out, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = v * sigmoid_f32(v);
    }
}

// dx += dout·σ(x)(1 + x(1-σ(x))).
extern "C" __global__ void elem_silu_bwd_f32(float* dx, const float* dout, const float* x, long long n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float s = sigmoid_f32(v);
        dx[i] += dout[i] * s * (1.0f + v * (1.0f - s));
    }
}

// SwiGLU over x (rows, 2f), each row [gate(f) | up(f)]: out (rows, f) =
// silu(gate)·up. n = rows·f.
extern "C" __global__ void elem_swiglu_fwd_f32(float* out, const float* x, long long n, long long f) {
    GRID_STRIDE(i, n) {
        long long r = div_fast(i, f), j = i - r * f;
        float g = x[r * 2 * f + j], u = x[r * 2 * f + f + j];
        out[i] = g * sigmoid_f32(g) * u;
    }
}

// dgate += dout·up·silu'(gate), dup += dout·silu(gate), into dx (rows, 2f).
extern "C" __global__ void elem_swiglu_bwd_f32(float* dx, const float* dout, const float* x, long long n, long long f) {
    GRID_STRIDE(i, n) {
        long long r = div_fast(i, f), j = i - r * f;
        long long gi = r * 2 * f + j, ui = gi + f;
        float g = x[gi], u = x[ui], d = dout[i];
        float s = sigmoid_f32(g);
        dx[gi] += d * u * s * (1.0f + g * (1.0f - s));
        dx[ui] += d * g * s;
    }
}

// The squared ReLU (--squared-relu) and the attention output gate
// (--attention-output-gate), element by element as internal/cpu's
// SquaredReLU* and tensor's SigmoidGate: __host__ __device__ so that
// testdata/hostcheck.cu compares them with the Go code without a GPU.
// Products and sums are rounded one at a time (__fmul_rn, __fadd_rn: no
// fused multiply-add, as Go on amd64), so the squared ReLU is the CPU's bit
// for bit; the gate's sigmoid is float64 as the CPU's, equal up to the
// float64 exp's last bit.

// mul_rn and add_rn are a float32 product and sum, each rounded on its own.
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// relu_go is Go's max(v, 0): NaN stays NaN, -0 becomes +0.
__host__ __device__ __forceinline__ float relu_go(float v) { return v != v ? v : (v > 0.0f ? v : 0.0f); }

// sqrelu_fwd_one is relu(x)².
__host__ __device__ __forceinline__ float sqrelu_fwd_one(float v) {
    float r = relu_go(v);
    return mul_rn(r, r);
}

// sqrelu_bwd_one is dx + dout·(2·relu(x)).
__host__ __device__ __forceinline__ float sqrelu_bwd_one(float dx, float dout, float v) {
    return add_rn(dx, mul_rn(dout, mul_rn(2.0f, relu_go(v))));
}

// sigmoid_f64 is 1/(1+exp(-g)) in float64, as tensor's SigmoidGate.
__host__ __device__ __forceinline__ double sigmoid_f64(float g) { return 1.0 / (1.0 + exp(-(double)g)); }

// sgate_fwd_one is x·σ(g), σ rounded to float32 first.
__host__ __device__ __forceinline__ float sgate_fwd_one(float x, float g) { return mul_rn(x, (float)sigmoid_f64(g)); }

// sgate_bwd_one sets dx = d·σ(g) and dg = d·x·σ(g)(1-σ(g)) (in float64,
// left to right as the CPU: no sum, so nothing to contract).
__host__ __device__ __forceinline__ void sgate_bwd_one(float* dx, float* dg, float d, float x, float g) {
    double s = sigmoid_f64(g);
    *dx = mul_rn(d, (float)s);
    *dg = (float)((double)d * (double)x * s * (1.0 - s));
}

// out = relu(x)².
extern "C" __global__ void elem_sqrelu_fwd_f32(float* out, const float* x, long long n) {
    GRID_STRIDE(i, n) { out[i] = sqrelu_fwd_one(x[i]); }
}

// dx += dout·2·relu(x).
extern "C" __global__ void elem_sqrelu_bwd_f32(float* dx, const float* dout, const float* x, long long n) {
    GRID_STRIDE(i, n) { dx[i] = sqrelu_bwd_one(dx[i], dout[i], x[i]); }
}

// out = x·σ(gate), x and gate dense of n elements.
extern "C" __global__ void elem_sigmoid_gate_fwd_f32(float* out, const float* x, const float* gate, long long n) {
    GRID_STRIDE(i, n) { out[i] = sgate_fwd_one(x[i], gate[i]); }
}

// dx = dout·σ(gate), dgate = dout·x·σ'(gate): written, not accumulated (the
// tape adds the Function's gradients).
extern "C" __global__ void elem_sigmoid_gate_bwd_f32(float* dx, float* dgate, const float* dout, const float* x, const float* gate, long long n) {
    GRID_STRIDE(i, n) {
        float a, b;
        sgate_bwd_one(&a, &b, dout[i], x[i], gate[i]);
        dx[i] = a;
        dgate[i] = b;
    }
}

// dx (n, c) += g[r] on every element of row r.
extern "C" __global__ void elem_add_row_broadcast_f32(float* dx, const float* g, long long total, long long c) {
    GRID_STRIDE(i, total) { dx[i] += g[div_fast(i, c)]; }
}

// dx[r, arg[r]] += g[r] for the n rows of dx (n, c).
extern "C" __global__ void elem_add_at_row_index_f32(float* dx, const int* arg, const float* g, long long n, long long c) {
    GRID_STRIDE(r, n) { dx[r * c + arg[r]] += g[r]; }
}
