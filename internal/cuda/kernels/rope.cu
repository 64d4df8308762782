// Rotary position embeddings of the CUDA backend
// (tensor/cuda_backend_norm.go), following internal/cpu/rope.go's apply:
// the first rot = 2·half dimensions of every head rotate in pairs by the
// float32 cos/sin tables (maxPos, half) the host built (tensor.RoPE), the
// rest are copied (forward) or added (backward). Pairs are (i, i+half)
// (rotate-half) or (2i, 2i+1) (interleaved). The rotation rounds each
// product and sum as the CPU does (no fused multiply-add), so results are
// the CPU's bit for bit.
//
// One block row per head row (b·t·h of them, grid-strided): threads take
// the head's half pairs, then its d-rot copied dimensions. out may alias x
// (each thread reads its elements before writing them).
//
// positions (b·t int32) may be null for 0..t-1 in every sequence. A
// position outside [0, maxPos) writes NaN over the head (the CPU panics;
// the device cannot, and reading positions back would stall the stream).

#include <stdint.h>

// rope_apply_f32: sign +1 forward (overwrite), -1 backward (accumulate:
// acc set). heads = b·t·h; h heads per row; t positions per sequence.
extern "C" __global__ void __launch_bounds__(128) rope_apply_f32(float* out, const float* x, const float* cosT, const float* sinT,
                                          const int32_t* positions, long long heads, int h, int t, int d, int half,
                                          int interleaved, int maxPos, float sign, int acc) {
    const int rot = 2 * half;
    const int work = half + (d - rot);
    for (long long hr = blockIdx.x; hr < heads; hr += gridDim.x) {
        const long long row = hr / h;
        const long long p = positions != nullptr ? (long long)positions[row] : row % t;
        const bool bad = p < 0 || p >= maxPos;
        const float* xi = x + hr * d;
        float* oi = out + hr * d;
        for (int k = threadIdx.x; k < work; k += blockDim.x) {
            if (k < half) {
                const int a = interleaved ? 2 * k : k;
                const int c = interleaved ? 2 * k + 1 : k + half;
                const float x1 = xi[a], x2 = xi[c];
                float y1, y2;
                if (bad) {
                    y1 = y2 = __int_as_float(0x7fc00000);
                } else {
                    const float cs = cosT[p * half + k];
                    const float s = __fmul_rn(sign, sinT[p * half + k]);
                    y1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, s));
                    y2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, s));
                }
                if (acc) {
                    oi[a] = __fadd_rn(oi[a], y1);
                    oi[c] = __fadd_rn(oi[c], y2);
                } else {
                    oi[a] = y1;
                    oi[c] = y2;
                }
            } else {
                const int j = rot + (k - half);
                const float v = bad ? __int_as_float(0x7fc00000) : xi[j];
                oi[j] = acc ? __fadd_rn(oi[j], v) : v;
            }
        }
    }
}
