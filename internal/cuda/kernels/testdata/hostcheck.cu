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
//	hostcheck gdnl2 n d eps < x, dy, dx (n·d each) → out, dx
//	hostcheck gdngates rows h < alpha, b (rows·h), aLog, dtBias (h), dg,
//	    dbeta, dalpha, db (rows·h), daLog, ddtBias (h) → g, beta, dalpha,
//	    db, daLog, ddtBias
//	hostcheck gdndelta B T H KH dk dv chunk scale < q, k (B·T·KH·dk), v
//	    (B·T·H·dv), g, beta (B·T·H), dout (B·T·H·dv) → out, saved, dq, dk,
//	    dv, dg, dbeta: the gated delta rule's kernels in the order
//	    tensor/cuda_backend_gdn.go launches them
//	hostcheck gdnruns R c k H dk dv scale < the runs' R token counts
//	    (decimal), x (n·c), w (c·k), conv states (R·(k-1)·c), q, k (n·H·dk),
//	    v (n·H·dv), g, beta (n·H), rule states (R·H·dk·dv) → conv out,
//	    conv states, rule out, rule states (the decoding kernels)
//	(all float32 bits in hex, one a line, unless said otherwise)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../elem.cu"
#include "../dropout.cu"
#include "../gdn.cu"

// readHex reads n float32s as hex bits, one a line; false on short input.
static bool readHex(float* dst, long long n) {
    for (long long i = 0; i < n; i++) {
        unsigned int u;
        if (scanf("%x", &u) != 1) return false;
        dst[i] = f32_from_bits(u);
    }
    return true;
}

static void printHex(const float* src, long long n) {
    for (long long i = 0; i < n; i++) printf("%x\n", f32_bits(src[i]));
}

static float* floats(long long n) { return (float*)calloc(n > 0 ? n : 1, sizeof(float)); }

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
    if (strcmp(argv[1], "gdnl2") == 0 && argc == 5) {
        const long long n = atoll(argv[2]);
        const int d = atoi(argv[3]);
        const double eps = strtod(argv[4], 0);
        float *x = floats(n * d), *dy = floats(n * d), *dx = floats(n * d), *out = floats(n * d);
        if (!readHex(x, n * d) || !readHex(dy, n * d) || !readHex(dx, n * d)) return 3;
        for (long long r = 0; r < n; r++) gdn_l2norm_fwd_row(out, x, r, d, eps);
        for (long long r = 0; r < n; r++) gdn_l2norm_bwd_row(dx, dy, x, r, d, eps);
        printHex(out, n * d);
        printHex(dx, n * d);
        return 0;
    }
    if (strcmp(argv[1], "gdngates") == 0 && argc == 4) {
        const long long rows = atoll(argv[2]);
        const int h = atoi(argv[3]);
        const long long n = rows * h;
        float *alpha = floats(n), *b = floats(n), *aLog = floats(h), *dtBias = floats(h), *dg = floats(n), *dbeta = floats(n);
        float *dalpha = floats(n), *db = floats(n), *daLog = floats(h), *ddtBias = floats(h);
        float *g = floats(n), *beta = floats(n), *tdt = floats(n), *taLog = floats(n);
        if (!readHex(alpha, n) || !readHex(b, n) || !readHex(aLog, h) || !readHex(dtBias, h) || !readHex(dg, n) || !readHex(dbeta, n) ||
            !readHex(dalpha, n) || !readHex(db, n) || !readHex(daLog, h) || !readHex(ddtBias, h))
            return 3;
        for (long long i = 0; i < n; i++) gdn_gates_fwd_one(g, beta, alpha, b, aLog, dtBias, i, h);
        for (long long i = 0; i < n; i++) gdn_gates_bwd_one(dalpha, db, tdt, taLog, dg, dbeta, alpha, b, aLog, dtBias, i, h);
        for (int j = 0; j < h; j++) gdn_gates_sums_one(daLog, ddtBias, taLog, tdt, rows, h, j);
        printHex(g, n);
        printHex(beta, n);
        printHex(dalpha, n);
        printHex(db, n);
        printHex(daLog, h);
        printHex(ddtBias, h);
        return 0;
    }
    if (strcmp(argv[1], "gdndelta") == 0 && argc == 10) {
        const int B = atoi(argv[2]), T = atoi(argv[3]), H = atoi(argv[4]), KH = atoi(argv[5]), dk = atoi(argv[6]), dv = atoi(argv[7]),
                  chunk = atoi(argv[8]);
        const float sc = (float)strtod(argv[9], 0);
        const long long rows = (long long)B * T, nq = rows * KH * dk, nr = rows * H * dk, nv = rows * H * dv, ng = rows * H;
        const long long nc = (T + chunk - 1) / chunk, sz = (long long)dk * dv, P = (long long)B * H;
        float *q = floats(nq), *k = floats(nq), *v = floats(nv), *g = floats(ng), *beta = floats(ng), *dout = floats(nv);
        if (!readHex(q, nq) || !readHex(k, nq) || !readHex(v, nv) || !readHex(g, ng) || !readHex(beta, ng) || !readHex(dout, nv)) return 3;
        float *qr = q, *kr = k;
        if (KH != H) {
            qr = floats(nr), kr = floats(nr);
            for (long long e = 0; e < nr; e++) qr[e] = gdn_repeat_one(q, e, KH, H, dk), kr[e] = gdn_repeat_one(k, e, KH, H, dk);
        }
        float *out = floats(nv), *saved = floats(P * nc * sz), *state = floats(P * sz);
        for (long long e = 0; e < P * dv; e++) gdn_delta_fwd_col(out, saved, state, qr, kr, v, g, beta, e, T, H, dk, dv, sc, chunk);
        float *dq = floats(nr), *dk_ = floats(nr), *dvv = floats(nv), *dg = floats(ng), *dbeta = floats(ng);
        float *states = floats(P * (chunk + 1) * sz), *dS = floats(P * sz), *dS1 = floats(P * chunk * sz);
        float *us = floats(P * chunk * dv), *dds = floats(P * chunk * dv);
        for (int ci = (int)nc - 1; ci >= 0; ci--) {
            for (long long e = 0; e < P * dv; e++) gdn_delta_states_col(states, saved, kr, v, g, beta, e, T, H, dk, dv, chunk, ci);
            for (long long e = 0; e < P * dv; e++)
                gdn_delta_sweep_col(dS, dS1, us, dds, dvv, states, qr, kr, v, g, beta, dout, e, T, H, dk, dv, sc, chunk, ci);
            for (long long e = 0; e < P * chunk * dk; e++)
                gdn_delta_rowsums_one(dq, dk_, states, dS1, us, dds, qr, kr, v, g, beta, dout, e, T, H, dk, dv, sc, chunk, ci);
            for (long long e = 0; e < P * chunk; e++) gdn_delta_stepsums_one(dg, dbeta, states, dS1, us, dds, kr, v, g, beta, e, T, H, dk, dv, chunk, ci);
        }
        float *dqo = dq, *dko = dk_;
        if (KH != H) {
            dqo = floats(nq), dko = floats(nq);
            for (long long e = 0; e < nq; e++) dqo[e] = gdn_fold_one(dqo, dq, e, KH, H, dk), dko[e] = gdn_fold_one(dko, dk_, e, KH, H, dk);
        }
        printHex(out, nv);
        printHex(saved, P * nc * sz);
        printHex(dqo, nq);
        printHex(dko, nq);
        printHex(dvv, nv);
        printHex(dg, ng);
        printHex(dbeta, ng);
        return 0;
    }
    if (strcmp(argv[1], "gdnruns") == 0 && argc == 9) {
        const int R = atoi(argv[2]), c = atoi(argv[3]), k = atoi(argv[4]), H = atoi(argv[5]), dk = atoi(argv[6]), dv = atoi(argv[7]);
        const float sc = (float)strtod(argv[8], 0);
        int* starts = (int*)calloc(R + 1, sizeof(int));
        for (int r = 0; r < R; r++) {
            int t;
            if (scanf("%d", &t) != 1) return 3;
            starts[r + 1] = starts[r] + t;
        }
        const long long n = starts[R], hw = k - 1;
        float *x = floats(n * c), *w = floats((long long)c * k), *cs = floats(R * hw * c), *q = floats(n * H * dk), *kk = floats(n * H * dk);
        float *v = floats(n * H * dv), *g = floats(n * H), *beta = floats(n * H), *rs = floats((long long)R * H * dk * dv);
        if (!readHex(x, n * c) || !readHex(w, (long long)c * k) || !readHex(cs, R * hw * c) || !readHex(q, n * H * dk) || !readHex(kk, n * H * dk) ||
            !readHex(v, n * H * dv) || !readHex(g, n * H) || !readHex(beta, n * H) || !readHex(rs, (long long)R * H * dk * dv))
            return 3;
        float *co = floats(n * c), *ro = floats(n * H * dv);
        for (long long e = 0; e < (long long)R * c; e++) gdn_conv_runs_one(co, cs, x, w, starts, e, c, k);
        for (long long e = 0; e < (long long)R * H * dv; e++) gdn_delta_runs_one(ro, rs, q, kk, v, g, beta, starts, e, H, dk, dv, sc);
        printHex(co, n * c);
        printHex(cs, R * hw * c);
        printHex(ro, n * H * dv);
        printHex(rs, (long long)R * H * dk * dv);
        return 0;
    }
    return 2;
}
