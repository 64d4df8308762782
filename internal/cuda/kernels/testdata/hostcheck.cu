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
//	hostcheck dsahad n d < x (n·d) → the Hadamard rotation (dsa.cu)
//	hostcheck dsatopk rows T K < scores (rows·T) → idx (rows·K, decimal)
//	hostcheck dsaindex B T H D relu < q (B·T·H·D), k (B·T·D), w (B·T·H),
//	    ds (B·T·T) → scores (B·T·T), dq, dk, dw: the indexer's scores and
//	    backward, the products by host loops in cuda_backend_dsa.go's
//	    chunks of queries
//	hostcheck dsaattn B T N dk dv K scale < q, k (B·T·N·dk), v, dout
//	    (B·T·N·dv), idx (B·T·K, decimal) → out, lse, dq, dk, dv: the sparse
//	    attention's forward and backward, the products by host loops
//	hostcheck dsaloss B T N dk K scale sparse perToken < q, k (B·T·N·dk),
//	    scores (B·T·T), idx (B·T·K, decimal) → target (normalised),
//	    dlogits, then the loss (%.17g)
//	(all float32 bits in hex, one a line, unless said otherwise)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../elem.cu"
#include "../dropout.cu"
#include "../gdn.cu"
#include "../dsa.cu"

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

static bool readInts(int* dst, long long n) {
    for (long long i = 0; i < n; i++) {
        if (scanf("%d", &dst[i]) != 1) return false;
    }
    return true;
}

// hgemm is a host stand-in for cuBLAS's row-major product as
// tensor/cuda_backend_dsa.go asks for it: C (m×n, row stride ldc) =
// alpha·op(A)·op(B) + beta·C, A and B row-major with row strides lda, ldb
// (op: transposed when tA, tB), sums in float32.
static void hgemm(bool tA, bool tB, int m, int n, int k, float alpha, const float* A, long long lda, const float* B, long long ldb, float beta,
                  float* C, long long ldc) {
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int c = 0; c < k; c++) acc += (tA ? A[c * lda + i] : A[i * lda + c]) * (tB ? B[j * ldb + c] : B[c * ldb + j]);
            C[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * C[i * ldc + j] : 0.0f);
        }
    }
}

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
    if (strcmp(argv[1], "dsahad") == 0 && argc == 4) {
        const long long n = atoll(argv[2]);
        const int d = atoi(argv[3]);
        float *x = floats(n * d), *out = floats(n * d);
        double* scratch = (double*)calloc(n * d, sizeof(double));
        if (!readHex(x, n * d)) return 3;
        for (long long r = 0; r < n; r++) dsa_hadamard_row(out, x, scratch, r, d, 1.0 / sqrt((double)d));
        printHex(out, n * d);
        return 0;
    }
    if (strcmp(argv[1], "dsatopk") == 0 && argc == 5) {
        const long long rows = atoll(argv[2]);
        const int T = atoi(argv[3]), K = atoi(argv[4]);
        int tp = 1;
        while (tp < T) tp *= 2;
        float* scores = floats(rows * T);
        if (!readHex(scores, rows * T)) return 3;
        uint64_t* keys = (uint64_t*)calloc(rows * tp, sizeof(uint64_t));
        int* idx = (int*)calloc(rows * K, sizeof(int));
        for (long long e = 0; e < rows * tp; e++) keys[e] = dsa_topk_key(scores, e, T, tp);
        for (int k = 2; k <= tp; k *= 2) {
            for (int jj = k / 2; jj > 0; jj /= 2) {
                for (long long e = 0; e < rows * tp; e++) dsa_bitonic_one(keys, e, tp, k, jj);
            }
        }
        for (long long e = 0; e < rows * K; e++) idx[e] = dsa_topk_out_one(keys, e, tp, K);
        for (long long e = 0; e < rows * K; e++) printf("%d\n", idx[e]);
        return 0;
    }
    if (strcmp(argv[1], "dsaindex") == 0 && argc == 7) {
        const int B = atoi(argv[2]), T = atoi(argv[3]), H = atoi(argv[4]), D = atoi(argv[5]), relu = atoi(argv[6]);
        const long long nq = (long long)B * T * H * D, nk = (long long)B * T * D, nw = (long long)B * T * H, ns = (long long)B * T * T;
        float *q = floats(nq), *k = floats(nk), *w = floats(nw), *ds = floats(ns);
        if (!readHex(q, nq) || !readHex(k, nk) || !readHex(w, nw) || !readHex(ds, ns)) return 3;
        float *scores = floats(ns), *dq = floats(nq), *dk = floats(nk), *dw = floats(nw);
        const int chunk = 3;  // queries a chunk: several chunks, one short
        float* p = floats((long long)chunk * H * T);
        for (int b = 0; b < B; b++) {
            for (int i0 = 0; i0 < T; i0 += chunk) {
                const int n = T - i0 < chunk ? T - i0 : chunk;
                const float* qc = q + ((long long)b * T + i0) * H * D;
                hgemm(false, true, n * H, T, D, 1.0f, qc, D, k + (long long)b * T * D, D, 0.0f, p, T);
                for (long long e = 0; e < (long long)n * T; e++) scores[((long long)b * T + i0) * T + e] = dsa_combine_one(p, w, e, b, i0, T, H, relu);
                for (long long e = 0; e < (long long)n * H; e++) dsa_index_bwd_row(p, dw, ds, w, e, b, i0, T, H, relu);
                hgemm(false, false, n * H, D, T, 1.0f, p, T, k + (long long)b * T * D, D, 1.0f, dq + ((long long)b * T + i0) * H * D, D);
                hgemm(true, false, T, D, n * H, 1.0f, p, T, qc, D, 1.0f, dk + (long long)b * T * D, D);
            }
        }
        printHex(scores, ns);
        printHex(dq, nq);
        printHex(dk, nk);
        printHex(dw, nw);
        return 0;
    }
    if (strcmp(argv[1], "dsaattn") == 0 && argc == 9) {
        const int B = atoi(argv[2]), T = atoi(argv[3]), N = atoi(argv[4]), dk = atoi(argv[5]), dv = atoi(argv[6]), K = atoi(argv[7]);
        const float scale = (float)strtod(argv[8], 0);
        const long long nq = (long long)B * T * N * dk, nv = (long long)B * T * N * dv, ni = (long long)B * T * K;
        float *q = floats(nq), *k = floats(nq), *v = floats(nv), *dout = floats(nv);
        int* idx = (int*)calloc(ni, sizeof(int));
        if (!readHex(q, nq) || !readHex(k, nq) || !readHex(v, nv) || !readHex(dout, nv) || !readInts(idx, ni)) return 3;
        float *out = floats(nv), *lse = floats((long long)B * T * N), *dq = floats(nq), *dkk = floats(nq), *dvv = floats(nv);
        const int hc = 2;  // heads a chunk: several chunks, one short when N is odd
        float *S = floats((long long)hc * T * T), *dP = floats((long long)hc * T * T), *pk = floats((long long)hc * T * K);
        for (int b = 0; b < B; b++) {
            for (int h0 = 0; h0 < N; h0 += hc) {
                const int n = N - h0 < hc ? N - h0 : hc;
                const long long qo = (long long)b * T * N, tt = (long long)T * T;
                for (int hh = 0; hh < n; hh++)
                    hgemm(false, true, T, T, dk, scale, q + (qo + h0 + hh) * dk, (long long)N * dk, k + (qo + h0 + hh) * dk, (long long)N * dk, 0.0f,
                          S + hh * tt, T);
                for (long long e = 0; e < (long long)n * T; e++) dsa_sparse_fwd_row(S, lse, pk, idx, e, b, h0, T, N, K);
                for (int hh = 0; hh < n; hh++)
                    hgemm(false, false, T, dv, T, 1.0f, S + hh * tt, T, v + (qo + h0 + hh) * dv, (long long)N * dv, 0.0f, out + (qo + h0 + hh) * dv,
                          (long long)N * dv);
            }
        }
        for (int b = 0; b < B; b++) {
            for (int h0 = 0; h0 < N; h0 += hc) {
                const int n = N - h0 < hc ? N - h0 : hc;
                const long long qo = (long long)b * T * N, tt = (long long)T * T;
                for (int hh = 0; hh < n; hh++) {
                    hgemm(false, true, T, T, dk, scale, q + (qo + h0 + hh) * dk, (long long)N * dk, k + (qo + h0 + hh) * dk, (long long)N * dk, 0.0f,
                          S + hh * tt, T);
                    hgemm(false, true, T, T, dv, 1.0f, dout + (qo + h0 + hh) * dv, (long long)N * dv, v + (qo + h0 + hh) * dv, (long long)N * dv, 0.0f,
                          dP + hh * tt, T);
                }
                for (long long e = 0; e < (long long)n * T; e++) dsa_sparse_probs_row(S, lse, pk, idx, e, b, h0, T, N, K);
                for (long long e = 0; e < (long long)n * T; e++) dsa_sparse_ds_row(dP, S, dout, out, e, b, h0, T, N, dv, scale);
                for (int hh = 0; hh < n; hh++) {
                    hgemm(true, false, T, dv, T, 1.0f, S + hh * tt, T, dout + (qo + h0 + hh) * dv, (long long)N * dv, 1.0f, dvv + (qo + h0 + hh) * dv,
                          (long long)N * dv);
                    hgemm(false, false, T, dk, T, 1.0f, dP + hh * tt, T, k + (qo + h0 + hh) * dk, (long long)N * dk, 1.0f, dq + (qo + h0 + hh) * dk,
                          (long long)N * dk);
                    hgemm(true, false, T, dk, T, 1.0f, dP + hh * tt, T, q + (qo + h0 + hh) * dk, (long long)N * dk, 1.0f, dkk + (qo + h0 + hh) * dk,
                          (long long)N * dk);
                }
            }
        }
        printHex(out, nv);
        printHex(lse, (long long)B * T * N);
        printHex(dq, nq);
        printHex(dkk, nq);
        printHex(dvv, nv);
        return 0;
    }
    if (strcmp(argv[1], "dsaloss") == 0 && argc == 10) {
        const int B = atoi(argv[2]), T = atoi(argv[3]), N = atoi(argv[4]), dk = atoi(argv[5]), K = atoi(argv[6]);
        const float scale = (float)strtod(argv[7], 0);
        const int sparse = atoi(argv[8]), perToken = atoi(argv[9]);
        const long long nq = (long long)B * T * N * dk, ns = (long long)B * T * T, ni = (long long)B * T * K;
        float *q = floats(nq), *k = floats(nq), *scores = floats(ns);
        int* idx = (int*)calloc(ni, sizeof(int));
        if (!readHex(q, nq) || !readHex(k, nq) || !readHex(scores, ns) || !readInts(idx, ni)) return 3;
        float *target = floats(ns), *dlogits = floats(ns), *S = floats((long long)T * T);
        double* rowLoss = (double*)calloc((long long)B * T, sizeof(double));
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < N; h++) {  // one head a chunk
                const long long qo = (long long)b * T * N;
                hgemm(false, true, T, T, dk, scale, q + (qo + h) * dk, (long long)N * dk, k + (qo + h) * dk, (long long)N * dk, 0.0f, S, T);
                for (long long i = 0; i < T; i++) dsa_target_row(target, S, idx, i, b, 1, T, K, sparse);
            }
        }
        const double div = perToken ? 1.0 : (double)B * T;
        for (long long r = 0; r < (long long)B * T; r++) dsa_loss_row(dlogits, rowLoss, target, scores, idx, r, T, K, sparse, div);
        double loss = 0.0;
        for (long long r = 0; r < (long long)B * T; r++) loss += rowLoss[r];
        printHex(target, ns);
        printHex(dlogits, ns);
        printf("%.17g\n", loss / div);
        return 0;
    }
    return 2;
}
