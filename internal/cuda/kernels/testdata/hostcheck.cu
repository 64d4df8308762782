// hostcheck runs the kernels' __host__ __device__ helpers on the host, for
// TestHost* (hostcheck_test.go) to compare with the Go code they port:
// internal/half's conversions, Go's float-to-int conversion, and
// tensor.RNG's Philox dropout mask. Built by the test with nvcc.
//
//	hostcheck f32 < hex float32 bits, one a line → "bf16 f16 i32 i64" in hex
//	hostcheck half         → for each 16-bit h: the float32 bits of bf16 h and f16 h
//	hostcheck dropout k0 k1 offset thr keepbits n → n mask values' bits
//	hostcheck sqrelu < "x dout dx" float32 bits in hex, one triple a line
//	    → "fwd bwd": relu(x)², dx + dout·2·relu(x)
//	hostcheck sgate < "x gate dout" float32 bits in hex, one triple a line
//	    → "out dx dgate": the output gate's forward and backward
//	hostcheck gdnconv b t c k < x (b·t·c), w (c·k), dout (b·t·c), dx (b·t·c),
//	    dw (c·k): float32 bits in hex, one a line → out, dx, dw the same way
//	    (gdn.cu's causal convolution with SiLU, forward and backward)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../elem.cu"
#include "../dropout.cu"
#include "../gdn.cu"

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "f32") == 0) {
        unsigned int u;
        while (scanf("%x", &u) == 1) {
            float f = f32_from_bits(u);
            printf("%x %x %x %llx\n", (unsigned)bf16_from_f32(f), (unsigned)f16_from_f32(f), (unsigned)i32_from_f32(f), (unsigned long long)i64_from_f32(f));
        }
        return 0;
    }
    if (strcmp(argv[1], "half") == 0) {
        for (unsigned h = 0; h < 65536; h++) {
            printf("%x %x\n", f32_bits(f32_from_bf16((uint16_t)h)), f32_bits(f32_from_f16((uint16_t)h)));
        }
        return 0;
    }
    if (strcmp(argv[1], "dropout") == 0 && argc == 8) {
        uint32_t k0 = (uint32_t)strtoul(argv[2], 0, 0), k1 = (uint32_t)strtoul(argv[3], 0, 0);
        unsigned long long offset = strtoull(argv[4], 0, 0);
        uint32_t thr = (uint32_t)strtoul(argv[5], 0, 0);
        float keep = f32_from_bits((uint32_t)strtoul(argv[6], 0, 0));
        long long n = strtoll(argv[7], 0, 0);
        float* mask = (float*)calloc(n + 4, sizeof(float));
        for (long long b = 0; b < (n + 3) / 4; b++) dropout_block(mask, n, b, k0, k1, offset, thr, keep);
        for (long long i = 0; i < n; i++) printf("%x\n", f32_bits(mask[i]));
        return 0;
    }
    if (strcmp(argv[1], "sqrelu") == 0) {
        unsigned int x, d, dx;
        while (scanf("%x %x %x", &x, &d, &dx) == 3) {
            printf("%x %x\n", f32_bits(sqrelu_fwd_one(f32_from_bits(x))),
                   f32_bits(sqrelu_bwd_one(f32_from_bits(dx), f32_from_bits(d), f32_from_bits(x))));
        }
        return 0;
    }
    if (strcmp(argv[1], "sgate") == 0) {
        unsigned int x, g, d;
        while (scanf("%x %x %x", &x, &g, &d) == 3) {
            float a, b;
            sgate_bwd_one(&a, &b, f32_from_bits(d), f32_from_bits(x), f32_from_bits(g));
            printf("%x %x %x\n", f32_bits(sgate_fwd_one(f32_from_bits(x), f32_from_bits(g))), f32_bits(a), f32_bits(b));
        }
        return 0;
    }
    if (strcmp(argv[1], "gdnconv") == 0 && argc == 6) {
        const int b = atoi(argv[2]), t = atoi(argv[3]), c = atoi(argv[4]), k = atoi(argv[5]);
        const long long n = (long long)b * t * c, nw = (long long)c * k;
        float* buf = (float*)calloc(4 * n + 2 * nw + n, sizeof(float));
        float *x = buf, *w = x + n, *dout = w + nw, *dx = dout + n, *dw = dx + n, *out = dw + nw, *dpre = out + n;
        for (long long i = 0; i < 3 * n + 2 * nw; i++) {
            unsigned int u;
            if (scanf("%x", &u) != 1) return 3;
            buf[i] = f32_from_bits(u);
        }
        for (long long e = 0; e < n; e++) out[e] = gdn_conv_fwd_one(x, w, e, t, c, k);
        for (long long e = 0; e < n; e++) dpre[e] = gdn_conv_dpre_one(dout, x, w, e, t, c, k);
        for (long long e = 0; e < n; e++) dx[e] = gdn_add(dx[e], gdn_conv_dx_one(dpre, w, e, t, c, k));
        for (long long e = 0; e < nw; e++) dw[e] = gdn_add(dw[e], gdn_conv_dw_one(dpre, x, e, b, t, c, k));
        for (long long e = 0; e < n; e++) printf("%x\n", f32_bits(out[e]));
        for (long long e = 0; e < n; e++) printf("%x\n", f32_bits(dx[e]));
        for (long long e = 0; e < nw; e++) printf("%x\n", f32_bits(dw[e]));
        return 0;
    }
    return 2;
}
