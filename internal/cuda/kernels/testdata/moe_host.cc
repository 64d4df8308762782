// moe_host runs moe.cu's router kernels on the host for TestMoEHostKernels
// (moe_host_test.go): the kernels loop over tokens grid-stride, so one
// host thread is the whole grid; the __d*_rn intrinsics are the plain
// IEEE operations (built with -ffp-contract=off: no fused multiply-add).
// The kernels' source runs unchanged. Built by the test with g++.
//
//	moe_host fwd T E k score pre groups groupTopK scaling hasBias
//	    stdin: logits (T·E float32), bias (E float32, if hasBias) → stdout: probs (T·E float32), sel (T·k int32)
//	moe_host exp n
//	    stdin: n float64 → stdout: moe_exp of each
//	moe_host log n
//	    stdin: n float64 → stdout: moe_log of each
//	moe_host bwd T E k score pre scaling seqLen dscRows losses zloss zc
//	    stdin: logits (T·E float32), sel (T·k int32), dprobs (T·E float32), dsc (dscRows·E float64)
//	    → stdout: dlogits (T·E float32)
//	moe_host perm T E k chunk
//	    stdin: sel (T·k int32) → stdout: counts (E int32), rows (T·k int32), flat (T·k int32)
//	moe_host auxcounts B S E k
//	    stdin: auxSel (B·S·k int32) → stdout: seqCounts (B·E int32)
//	moe_host z T E
//	    stdin: logits (T·E float32) → stdout: lse (T float64), z (1 float64)
//	moe_host aux B S E k score
//	    stdin: logits (B·S·E float32) → stdout: auxSel (B·S·k int32), sums (B·E float64)
// Little-endian binary; scaling and zc are decimal float64s printed exactly (%.17g).

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define HOST_HARNESS_NAME "moe_host"
#include "host_harness.h"

#define __device__
#define __global__
#define __forceinline__ inline

struct moe_dim3 {
    unsigned x, y, z;
};
static const moe_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};

static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __longlong_as_double(long long v) {
    double d;
    memcpy(&d, &v, 8);
    return d;
}
static inline long long __double_as_longlong(double d) {
    long long v;
    memcpy(&v, &d, 8);
    return v;
}

#include "../moe.cu"

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "fwd") == 0 && argc == 11) {
        long long T = atoll(argv[2]);
        int E = atoi(argv[3]), k = atoi(argv[4]), score = atoi(argv[5]), pre = atoi(argv[6]), groups = atoi(argv[7]), gk = atoi(argv[8]);
        double scaling = strtod(argv[9], nullptr);
        int hasBias = atoi(argv[10]);
        auto logits = readN<float>(T * E);
        std::vector<float> bias;
        if (hasBias) bias = readN<float>(E);
        std::vector<float> probs(T * E);
        std::vector<int> sel(T * k);
        std::vector<double> scratch(T * (E + groups));
        moe_route_fwd_f32(probs.data(), sel.data(), scratch.data(), logits.data(), hasBias ? bias.data() : nullptr, T, E, k, score, pre,
                          groups, gk, scaling);
        writeAll(probs);
        writeAll(sel);
        return 0;
    }
    if (strcmp(argv[1], "bwd") == 0 && argc == 13) {
        long long T = atoll(argv[2]);
        int E = atoi(argv[3]), k = atoi(argv[4]), score = atoi(argv[5]), pre = atoi(argv[6]);
        double scaling = strtod(argv[7], nullptr);
        long long seqLen = atoll(argv[8]), dscRows = atoll(argv[9]);
        int losses = atoi(argv[10]), zloss = atoi(argv[11]);
        double zc = strtod(argv[12], nullptr);
        auto logits = readN<float>(T * E);
        auto sel = readN<int>(T * k);
        auto dprobs = readN<float>(T * E);
        auto dsc = readN<double>(dscRows * E);
        std::vector<float> dlogits(T * E);
        std::vector<double> scratch(T * 2 * E);
        moe_route_bwd_f32(dlogits.data(), scratch.data(), dprobs.data(), logits.data(), sel.data(), dscRows ? dsc.data() : nullptr, T, seqLen,
                          E, k, score, pre, scaling, losses, zloss, zc);
        writeAll(dlogits);
        return 0;
    }
    if (strcmp(argv[1], "aux") == 0 && argc == 7) {
        long long B = atoll(argv[2]), S = atoll(argv[3]), T = B * S;
        int E = atoi(argv[4]), k = atoi(argv[5]), score = atoi(argv[6]);
        auto logits = readN<float>(T * E);
        std::vector<int> auxSel(T * k);
        std::vector<double> q(T * E), sums(B * E);
        moe_route_aux_f32(auxSel.data(), q.data(), logits.data(), T, E, k, score);
        moe_route_aux_sums_f64(sums.data(), q.data(), B, S, E);
        writeAll(auxSel);
        writeAll(sums);
        return 0;
    }
    if (strcmp(argv[1], "perm") == 0 && argc == 6) {
        long long T = atoll(argv[2]), chunk = atoll(argv[5]);
        int E = atoi(argv[3]), k = atoi(argv[4]);
        auto sel = readN<int>(T * k);
        long long nc = (T + chunk - 1) / chunk;
        std::vector<int> cnt(nc * E), counts(E), rows(T * k, -1), flat(T * k, -1);
        moe_perm_count_i32(cnt.data(), sel.data(), T, E, k, chunk);
        moe_perm_scan_i32(counts.data(), cnt.data(), nc, E);
        moe_perm_rows_i32(rows.data(), flat.data(), cnt.data(), counts.data(), sel.data(), T, E, k, chunk);
        writeAll(counts);
        writeAll(rows);
        writeAll(flat);
        return 0;
    }
    if (strcmp(argv[1], "auxcounts") == 0 && argc == 6) {
        long long B = atoll(argv[2]), S = atoll(argv[3]);
        int E = atoi(argv[4]), k = atoi(argv[5]);
        auto auxSel = readN<int>(B * S * k);
        std::vector<int> seq(B * E);
        moe_perm_count_i32(seq.data(), auxSel.data(), B * S, E, k, S);
        writeAll(seq);
        return 0;
    }
    if (strcmp(argv[1], "z") == 0 && argc == 4) {
        long long T = atoll(argv[2]);
        int E = atoi(argv[3]);
        auto logits = readN<float>(T * E);
        std::vector<double> lse(T), z(1);
        moe_route_z_f64(lse.data(), logits.data(), T, E);
        moe_route_zsum_f64(z.data(), lse.data(), T);
        writeAll(lse);
        writeAll(z);
        return 0;
    }
    if (strcmp(argv[1], "log") == 0 && argc == 3) {
        auto x = readN<double>(atoll(argv[2]));
        for (auto& v : x) v = moe_log(v);
        writeAll(x);
        return 0;
    }
    if (strcmp(argv[1], "exp") == 0 && argc == 3) {
        auto x = readN<double>(atoll(argv[2]));
        for (auto& v : x) v = moe_exp(v);
        writeAll(x);
        return 0;
    }
    fprintf(stderr, "moe_host: bad arguments\n");
    return 2;
}
