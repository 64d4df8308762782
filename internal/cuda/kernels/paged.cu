// Decoding kernels of the CUDA backend (tensor/decode_ops.go): the paged KV
// cache's write and attention, and the bias add of PackedLinear.
//
// PagedAttention's arithmetic is fixed by tensor.PagedAttention and must
// match the CPU bit for bit (tensor/backendtest.PagedAttentionRef): scores
// are float64 dot products with 16 fused-multiply-add partial sums added in
// order, times 1/sqrt(D); weights are float32(exp(s-max)/Σ exp(s-max)) with
// the float64 sum in position order; out is Σ_j w_j·v_j in float32, one
// rounded multiply and one rounded add per element, positions in order.
// Every operation below that must round as Go does is written with an
// explicit round-to-nearest intrinsic (__fma_rn, __dmul_rn, __dadd_rn,
// __fmul_rn, __fadd_rn, __ddiv_rn), so nvcc cannot contract or reorder it.
// exp is go_exp, a transcription of Go's math.Exp on amd64 with FMA (the
// path Go takes on every x86-64 CPU with AVX and FMA), so the weights agree
// with a CPU reference computed on such a machine.

#include <stdint.h>

#define GOEXP_LOG2E __longlong_as_double(0x3ff71547652b82fell)    // 1.4426950408889634
#define GOEXP_LN2U __longlong_as_double(0x3fe62e42fefa3000ll)     // 0.693147180559663
#define GOEXP_LN2L __longlong_as_double(0x3d53de6af278ece6ll)     // 2.8235290563031577e-13
#define GOEXP_OVERFLOW __longlong_as_double(0x40862e42fefa39efll) // 709.782712893384
#define GOEXP_C8 __longlong_as_double(0x3efa01a01a01a01all)       // 2.48015873015873e-05
#define GOEXP_C7 __longlong_as_double(0x3f2a01a01a01a01all)       // 0.0001984126984126984
#define GOEXP_C6 __longlong_as_double(0x3f56c16c16c16c17ll)       // 0.001388888888888889
#define GOEXP_C5 __longlong_as_double(0x3f81111111111111ll)       // 0.008333333333333333
#define GOEXP_C4 __longlong_as_double(0x3fa5555555555555ll)       // 0.041666666666666664
#define GOEXP_C3 __longlong_as_double(0x3fc5555555555555ll)       // 0.16666666666666666

// go_exp is Go's math.Exp as src/math/exp_amd64.s computes it on a CPU
// with FMA (Shibata's method: reduction by ln 2 in two parts, /16, a
// degree-8 Taylor polynomial, four squarings of (1+r)-1, then scaling by
// 2^e), operation by operation.
__device__ __forceinline__ double go_exp(double x) {
    const long long bits = __double_as_longlong(x);
    if ((bits & 0x7fffffffffffffffll) >= 0x7ff0000000000000ll) { // not finite
        if (bits == (long long)0xfff0000000000000ull) return 0.0; // -Inf
        return x;                                                  // NaN or +Inf
    }
    if (x > GOEXP_OVERFLOW) return __longlong_as_double(0x7ff0000000000000ll);
    int e = __double2int_rn(__dmul_rn(GOEXP_LOG2E, x)); // CVTSD2SL, round to nearest even
    const double fx = (double)e;
    x = __fma_rn(-fx, GOEXP_LN2U, x); // VFNMADD231SD
    x = __fma_rn(-fx, GOEXP_LN2L, x);
    x = __dmul_rn(x, 0.0625);
    double p = GOEXP_C8;
    p = __fma_rn(p, x, GOEXP_C7);
    p = __fma_rn(p, x, GOEXP_C6);
    p = __fma_rn(p, x, GOEXP_C5);
    p = __fma_rn(p, x, GOEXP_C4);
    p = __fma_rn(p, x, GOEXP_C3);
    p = __fma_rn(p, x, 0.5);
    p = __fma_rn(p, x, 1.0);
    x = __dmul_rn(x, p);
    x = __dmul_rn(x, __dadd_rn(x, 2.0));
    x = __dmul_rn(x, __dadd_rn(x, 2.0));
    x = __dmul_rn(x, __dadd_rn(x, 2.0));
    x = __fma_rn(x, __dadd_rn(x, 2.0), 1.0);
    // x · 2^e, with the assembly's overflow and denormal steps
    int be = e + 0x3ff;
    if (be <= 0) {
        if (be < -52) return 0.0;
        be += 0x3fe;
        x = __dmul_rn(x, __longlong_as_double((long long)be << 52));
        be = 1;
    } else if (be >= 0x7ff) {
        return __longlong_as_double(0x7ff0000000000000ll);
    }
    return __dmul_rn(x, __longlong_as_double((long long)be << 52));
}

// paged_kv_write_f32 copies k and v (rows, groups, d) into the pools
// (blocks, groups, bt, d) at the int32 slots (rows): block slot/bt, offset
// slot mod bt. One thread per element of k; a slot outside the pool is
// skipped (the CPU backend panics on it; tensor.PagedKVWrite's callers
// compute slots from their own block tables).
extern "C" __global__ void paged_kv_write_f32(float* kPool, float* vPool, const float* k, const float* v,
                                              const int32_t* slots, long long n, int groups, int d, int bt,
                                              int blocks) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long rg = idx / d;
        const int e = (int)(idx - rg * d);
        const long long i = rg / groups;
        const int h = (int)(rg - i * groups);
        const int s = slots[i];
        if (s < 0 || (long long)s >= (long long)blocks * bt) continue;
        const int b = s / bt, o = s % bt;
        const long long at = (((long long)b * groups + h) * bt + o) * d + e;
        kPool[at] = k[idx];
        vPool[at] = v[idx];
    }
}

#define PAGED_THREADS 128

// paged_attention_f32: grid (n, heads), PAGED_THREADS threads; one block
// per (query row rowBase + blockIdx.x, head). scratch holds n·heads·L
// doubles (L = maxBlocks·bt, the longest span a block table can address):
// the scores, then the exponentials, then the weights (float32 values kept
// as double). The caller launches the rows in chunks that bound scratch.
// A row that no span covers, a position past its table, or a block id
// outside the pool gives a NaN row (the CPU backend panics on them).
extern "C" __global__ void __launch_bounds__(PAGED_THREADS)
    paged_attention_f32(float* out, const float* q, const float* kPool, const float* vPool, const int32_t* tables,
                        const int32_t* spans, int seqs, int maxBlocks, int heads, int groups, int d, int bt,
                        int blocks, double scale, double* scratch, long long L, int rowBase) {
    const int i = rowBase + blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x;
    const int g = h / (heads / groups);
    __shared__ double red[PAGED_THREADS];
    __shared__ int bad;
    __shared__ double sum;
    float* o = out + ((long long)i * heads + h) * d;
    const float* qr = q + ((long long)i * heads + h) * d;
    double* sc = scratch + ((long long)blockIdx.x * heads + h) * L;

    // the sequence of row i: its span holds it
    int si = -1;
    for (int s = 0; s < seqs; s++) {
        const int row = spans[3 * s], n = spans[3 * s + 1];
        if (row <= i && i < row + n) {
            si = s;
            break;
        }
    }
    int limit = 0;
    if (si >= 0) limit = spans[3 * si + 2] + (i - spans[3 * si]) + 1;
    if (tid == 0) bad = si < 0 || spans[3 * si + 2] < 0 || (long long)limit > L;
    __syncthreads();
    if (bad) {
        for (int t = tid; t < d; t += blockDim.x) o[t] = __int_as_float(0x7fc00000);
        return;
    }
    const int32_t* table = tables + (long long)si * maxBlocks;

    // scores, and each thread's running maximum
    double mx = -INFINITY;
    for (int j = tid; j < limit; j += blockDim.x) {
        const int blk = table[j / bt];
        if (blk < 0 || blk >= blocks) {
            bad = 1;
            continue;
        }
        const float* kr = kPool + (((long long)blk * groups + g) * bt + j % bt) * d;
        double acc[16];
#pragma unroll
        for (int u = 0; u < 16; u++) acc[u] = 0.0;
        for (int e0 = 0; e0 < d; e0 += 16) {
#pragma unroll
            for (int u = 0; u < 16; u++)
                if (e0 + u < d) acc[u] = __fma_rn((double)qr[e0 + u], (double)kr[e0 + u], acc[u]);
        }
        double s = 0.0;
#pragma unroll
        for (int u = 0; u < 16; u++) s = __dadd_rn(s, acc[u]);
        s = __dmul_rn(s, scale);
        sc[j] = s;
        if (s > mx) mx = s;
    }
    red[tid] = mx;
    __syncthreads();
    if (tid == 0) {
        for (int t = 1; t < blockDim.x; t++)
            if (red[t] > mx) mx = red[t];
        red[0] = mx;
    }
    __syncthreads();
    if (bad) {
        for (int t = tid; t < d; t += blockDim.x) o[t] = __int_as_float(0x7fc00000);
        return;
    }
    mx = red[0];
    for (int j = tid; j < limit; j += blockDim.x) sc[j] = go_exp(__dsub_rn(sc[j], mx));
    __syncthreads();
    if (tid == 0) { // the sum in position order
        double acc = 0.0;
        for (int j = 0; j < limit; j++) acc = __dadd_rn(acc, sc[j]);
        sum = acc;
    }
    __syncthreads();
    const double total = sum;
    for (int j = tid; j < limit; j += blockDim.x) sc[j] = (double)__double2float_rn(__ddiv_rn(sc[j], total));
    __syncthreads();
    // out[t] = Σ_j w_j·v_j[t], positions in order
    for (int t = tid; t < d; t += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < limit; j++) {
            const int blk = table[j / bt];
            const float* vr = vPool + (((long long)blk * groups + g) * bt + j % bt) * d;
            acc = __fadd_rn(acc, __fmul_rn((float)sc[j], vr[t]));
        }
        o[t] = acc;
    }
}

// paged_bias_add_f32 adds b[c] to every element of column c of out (rows,
// cols): PackedLinear's bias, added to the rounded product.
extern "C" __global__ void paged_bias_add_f32(float* out, const float* b, long long n, int cols) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x)
        out[idx] = __fadd_rn(out[idx], b[idx % cols]);
}

// paged_copy_u32 copies n 32-bit words from src to dst.
extern "C" __global__ void paged_copy_u32(uint32_t* dst, const uint32_t* src, long long n) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x)
        dst[idx] = src[idx];
}
