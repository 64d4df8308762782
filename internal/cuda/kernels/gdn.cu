// The gated delta net's kernels (tensor/cuda_backend_gdn.go): so far its
// causal depthwise convolution with SiLU (tensor's CausalConvSiLU), each
// value computed as internal/cpu's CausalConvSiLUForward and
// CausalConvSiLUBackward compute it — the same sums in the same order,
// products and sums rounded one at a time (no fused multiply-add, as Go on
// amd64), the SiLU's sigmoid in float64 — so the results are the CPU's up
// to the float64 exp's last bit. The per-element bodies are
// __host__ __device__: testdata/hostcheck.cu runs them on the host against
// the Go code. One thread per output element, grid-stride.
//
// x (b, t, c) row-major, w (c, k): w[ch·k + k-1] weighs the current step.

#include <stdint.h>

#define GDN_GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

__host__ __device__ __forceinline__ float gdn_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float gdn_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

__host__ __device__ __forceinline__ double gdn_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ double gdn_dadd(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

// gdn_conv_at is the convolution before SiLU at element e = (i·t + s)·c + ch
// (internal/cpu's convAt).
__host__ __device__ __forceinline__ float gdn_conv_at(const float* x, const float* w, long long e, int t, int c, int k) {
    const long long r = e / c;
    const int ch = (int)(e - r * c);
    const int s = (int)(r % t);
    const long long i = r / t;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
        const int src = s - (k - 1) + j;
        if (src >= 0) acc = gdn_add(acc, gdn_mul(w[(long long)ch * k + j], x[(i * t + src) * c + ch]));
    }
    return acc;
}

// gdn_conv_fwd_one is silu of the convolution at e: p / (1 + exp(-p)),
// exp in float64 rounded to float32 as the CPU.
__host__ __device__ __forceinline__ float gdn_conv_fwd_one(const float* x, const float* w, long long e, int t, int c, int k) {
    const float p = gdn_conv_at(x, w, e, t, c, k);
    return p / gdn_add(1.0f, (float)exp(-(double)p));
}

// gdn_conv_dpre_one is the gradient before SiLU at e: dout·silu'(p), the
// derivative σ(1 + p(1-σ)) in float64.
__host__ __device__ __forceinline__ float gdn_conv_dpre_one(const float* dout, const float* x, const float* w, long long e, int t, int c,
                                                            int k) {
    const double p = (double)gdn_conv_at(x, w, e, t, c, k);
    const double sg = 1.0 / (1.0 + exp(-p));
    return gdn_mul(dout[e], (float)gdn_dmul(sg, gdn_dadd(1.0, gdn_dmul(p, 1.0 - sg))));
}

// gdn_conv_dx_one is Σ_j w[j]·dpre[s+(k-1)-j] at e, the sum the CPU adds
// into dx.
__host__ __device__ __forceinline__ float gdn_conv_dx_one(const float* dpre, const float* w, long long e, int t, int c, int k) {
    const long long r = e / c;
    const int ch = (int)(e - r * c);
    const int s = (int)(r % t);
    const long long i = r / t;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
        const int dst = s + (k - 1) - j;
        if (dst < t) acc = gdn_add(acc, gdn_mul(w[(long long)ch * k + j], dpre[(i * t + dst) * c + ch]));
    }
    return acc;
}

// gdn_conv_dw_one is Σ over batch rows and steps of dpre·x for weight
// e = ch·k + j, in the CPU's order.
__host__ __device__ __forceinline__ float gdn_conv_dw_one(const float* dpre, const float* x, long long e, int b, int t, int c, int k) {
    const int ch = (int)(e / k), j = (int)(e % k);
    float acc = 0.0f;
    for (int i = 0; i < b; i++) {
        for (int s = 0; s < t; s++) {
            const int src = s - (k - 1) + j;
            if (src >= 0) {
                acc = gdn_add(acc, gdn_mul(dpre[((long long)i * t + s) * c + ch], x[((long long)i * t + src) * c + ch]));
            }
        }
    }
    return acc;
}

// out (b, t, c) = silu(causal_conv(x, w)); n = b·t·c.
extern "C" __global__ void gdn_conv_silu_fwd_f32(float* out, const float* x, const float* w, long long n, int t, int c, int k) {
    GDN_GRID_STRIDE(e, n) { out[e] = gdn_conv_fwd_one(x, w, e, t, c, k); }
}

// dpre (b, t, c) = dout·silu'(conv): the backward's first pass.
extern "C" __global__ void gdn_conv_silu_dpre_f32(float* dpre, const float* dout, const float* x, const float* w, long long n, int t,
                                                  int c, int k) {
    GDN_GRID_STRIDE(e, n) { dpre[e] = gdn_conv_dpre_one(dout, x, w, e, t, c, k); }
}

// dx (b, t, c) += the transposed convolution of dpre.
extern "C" __global__ void gdn_conv_silu_dx_f32(float* dx, const float* dpre, const float* w, long long n, int t, int c, int k) {
    GDN_GRID_STRIDE(e, n) { dx[e] = gdn_add(dx[e], gdn_conv_dx_one(dpre, w, e, t, c, k)); }
}

// dw (c, k) += Σ dpre·x; n = c·k, one thread per weight.
extern "C" __global__ void gdn_conv_silu_dw_f32(float* dw, const float* dpre, const float* x, long long n, int b, int t, int c, int k) {
    GDN_GRID_STRIDE(e, n) { dw[e] = gdn_add(dw[e], gdn_conv_dw_one(dpre, x, e, b, t, c, k)); }
}
