// The MoE router of the CUDA backend (tensor/cuda_backend_moe.go): Megatron's
// TopKRouter as internal/cpu/moe.go's Route64 and RouteBackward64 compute
// it, for softmax (after or before the top-k) and sigmoid scores, the
// expert bias, group-limited top-k and the scaling factor, with the
// load-balancing losses' statistics and the z-loss, without capacity
// dropping (that routes on the host). One thread per token (grid-stride), every step in the CPU's
// order and float64 arithmetic, each product, sum and quotient rounded on
// its own (__dmul_rn and friends: no fused multiply-add), and e^x is
// moe_exp, the operations of internal/cpu's RouterExp: the experts chosen,
// the probabilities and the logits' gradients are the CPU's bit for bit.
//
// Top-k is the CPU's stable sort, descending: k passes of an argmax over
// the candidates not yet taken, a strictly larger key replacing the best,
// so equal keys go lowest index first. NaN keys are never chosen (the CPU's
// sort leaves them in place); logits are finite in training.
//
// The z-loss's log-sum-exp is moe_lse, its log moe_log (internal/cpu's
// RouterLog, the same operations), its sum over the tokens one thread's in
// token order: the z-loss and its gradient are the CPU's bit for bit too.
//
// sc is a per-token float64 scratch of E + G values (the scores, then the
// group sums); sel (T, k) int32 the chosen experts in the CPU's order.

#include <stdint.h>

#define MOE_SOFTMAX 0
#define MOE_SIGMOID 1

// moe_pow2 is 2^n for -1022 <= n <= 1023.
__device__ __forceinline__ double moe_pow2(int n) { return __longlong_as_double((long long)(n + 1023) << 52); }

// moe_exp is internal/cpu's RouterExp: FreeBSD's e^x, operation for operation.
__device__ double moe_exp(double x) {
    const double ln2Hi = 6.93147180369123816490e-01, ln2Lo = 1.90821492927058770002e-10, log2e = 1.44269504088896338700e+00;
    const double overflow = 7.09782712893383973096e+02, underflow = -7.45133219101941108420e+02, nearZero = 1.0 / (1 << 28);
    const double p1 = 1.66666666666666657415e-01, p2 = -2.77777777770155933842e-03, p3 = 6.61375632143793436117e-05;
    const double p4 = -1.65339022054652515390e-06, p5 = 4.13813679705723846039e-08;
    if (x != x) return x;
    if (x > overflow) return __longlong_as_double(0x7ff0000000000000ll);
    if (x < underflow) return 0.0;
    if (-nearZero < x && x < nearZero) return __dadd_rn(1.0, x);
    int k = 0;
    if (x < 0) k = (int)__dsub_rn(__dmul_rn(log2e, x), 0.5);
    if (x > 0) k = (int)__dadd_rn(__dmul_rn(log2e, x), 0.5);
    const double hi = __dsub_rn(x, __dmul_rn((double)k, ln2Hi));
    const double lo = __dmul_rn((double)k, ln2Lo);
    const double r = __dsub_rn(hi, lo);
    const double t = __dmul_rn(r, r);
    double q = __dadd_rn(p4, __dmul_rn(t, p5));
    q = __dadd_rn(p3, __dmul_rn(t, q));
    q = __dadd_rn(p2, __dmul_rn(t, q));
    q = __dadd_rn(p1, __dmul_rn(t, q));
    const double c = __dsub_rn(r, __dmul_rn(t, q));
    const double y = __dsub_rn(1.0, __dsub_rn(__dsub_rn(lo, __ddiv_rn(__dmul_rn(r, c), __dsub_rn(2.0, c))), hi));
    if (k < -1021) return __dmul_rn(__dmul_rn(y, moe_pow2(k + 53)), moe_pow2(-53));
    if (k > 1023) return __dmul_rn(__dmul_rn(y, moe_pow2(1023)), moe_pow2(k - 1023));
    return __dmul_rn(y, moe_pow2(k));
}

// moe_log is internal/cpu's RouterLog: FreeBSD's log x, operation for
// operation, with x = f·2^k by the bits.
__device__ double moe_log(double x) {
    const double ln2Hi = 6.93147180369123816490e-01, ln2Lo = 1.90821492927058770002e-10;
    const double l1 = 6.666666666666735130e-01, l2 = 3.999999999940941908e-01, l3 = 2.857142874366239149e-01;
    const double l4 = 2.222219843214978396e-01, l5 = 1.818357216161805012e-01, l6 = 1.531383769920937332e-01;
    const double l7 = 1.479819860511658591e-01;
    if (x != x || x > 1.79769313486231570815e+308) return x;
    if (x < 0) return __longlong_as_double(0x7ff8000000000000ll);
    if (x == 0) return -__longlong_as_double(0x7ff0000000000000ll);
    int ki = 0;
    if ((unsigned long long)__double_as_longlong(x) >> 52 == 0) { // subnormal: scaled by 2^52
        x = __dmul_rn(x, 4503599627370496.0);
        ki = -52;
    }
    const unsigned long long bits = (unsigned long long)__double_as_longlong(x);
    ki += (int)(bits >> 52 & 0x7ff) - 1022;
    double f1 = __longlong_as_double((long long)(bits & ~(0x7ffull << 52) | 1022ull << 52)); // in [0.5, 1)
    if (f1 < 0.70710678118654752440) { // √2/2
        f1 = __dmul_rn(f1, 2.0);
        ki--;
    }
    const double f = __dsub_rn(f1, 1.0), k = (double)ki;
    const double s = __ddiv_rn(f, __dadd_rn(2.0, f));
    const double s2 = __dmul_rn(s, s), s4 = __dmul_rn(s2, s2);
    const double t1 = __dmul_rn(s2, __dadd_rn(l1, __dmul_rn(s4, __dadd_rn(l3, __dmul_rn(s4, __dadd_rn(l5, __dmul_rn(s4, l7)))))));
    const double t2 = __dmul_rn(s4, __dadd_rn(l2, __dmul_rn(s4, __dadd_rn(l4, __dmul_rn(s4, l6)))));
    const double r = __dadd_rn(t1, t2);
    const double hfsq = __dmul_rn(__dmul_rn(0.5, f), f);
    return __dsub_rn(__dmul_rn(k, ln2Hi), __dsub_rn(__dsub_rn(hfsq, __dadd_rn(__dmul_rn(s, __dadd_rn(hfsq, r)), __dmul_rn(k, ln2Lo))), f));
}

// moe_sigmoid is score64's sigmoid: 1/(1 + e^-x).
__device__ __forceinline__ double moe_sigmoid(double x) { return __ddiv_rn(1.0, __dadd_rn(1.0, moe_exp(-x))); }

// moe_softmax writes softmax64 of the float32 logits l (n) into dst: the
// maximum, e^(v − max) summed in order, each divided by the sum.
__device__ void moe_softmax(double* dst, const float* l, int n) {
    double m = -__longlong_as_double(0x7ff0000000000000ll);
    for (int i = 0; i < n; i++) m = fmax(m, (double)l[i]);
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        dst[i] = moe_exp(__dsub_rn((double)l[i], m));
        s = __dadd_rn(s, dst[i]);
    }
    for (int i = 0; i < n; i++) dst[i] = __ddiv_rn(dst[i], s);
}

// moe_lse is logSumExp of the float32 logits l (n): the maximum plus the
// log of the sum of e^(v − max) in order (the z-loss's).
__device__ double moe_lse(const float* l, int n) {
    double m = -__longlong_as_double(0x7ff0000000000000ll);
    for (int i = 0; i < n; i++) m = fmax(m, (double)l[i]);
    double s = 0.0;
    for (int i = 0; i < n; i++) s = __dadd_rn(s, moe_exp(__dsub_rn((double)l[i], m)));
    return __dadd_rn(m, moe_log(s));
}

// moe_taken reports whether i is among idx[0..j).
__device__ __forceinline__ bool moe_taken(const int* idx, int j, int i) {
    for (int a = 0; a < j; a++)
        if (idx[a] == i) return true;
    return false;
}

// moe_key is the selection key of expert e: the logit (softmax after the
// top-k), the score (softmax before it), or the score plus the expert bias
// (sigmoid; bias may be null).
__device__ __forceinline__ double moe_key(int score, int pre, const float* l, const double* sc, const float* bias, int e) {
    if (score == MOE_SOFTMAX) return pre ? sc[e] : (double)l[e];
    return bias ? __dadd_rn(sc[e], (double)bias[e]) : sc[e];
}

// moe_route_fwd_f32: for each token t, sel[t·k..] the chosen experts
// (selectExperts: with groups, each group's sum of its top k/groupTopK keys
// in their order, the groupTopK largest groups, then the top-k over their
// experts) and probs (T, E) zero but at them, float32 of Route64's p.
extern "C" __global__ void moe_route_fwd_f32(float* probs, int* sel, double* scratch, const float* logits, const float* bias,
                                             long long T, int E, int k, int score, int pre, int groups, int groupTopK,
                                             double scaling) {
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (long long)gridDim.x * blockDim.x) {
        const float* l = logits + t * E;
        double* sc = scratch + t * (long long)(E + groups);
        double* gs = sc + E;
        int* s = sel + t * k;
        if (score == MOE_SOFTMAX) {
            if (pre) moe_softmax(sc, l, E);
        } else {
            for (int e = 0; e < E; e++) sc[e] = moe_sigmoid((double)l[e]);
        }
        unsigned long long chosen = ~0ull; // the groups in the running (bit g)
        if (groupTopK > 0) {
            const int per = E / groups, kg = k / groupTopK;
            for (int g = 0; g < groups; g++) {
                gs[g] = 0.0;
                for (int j = 0; j < kg; j++) { // s[0..kg) holds this group's picks
                    int best = -1;
                    double bk = 0.0;
                    for (int i = 0; i < per; i++) {
                        if (moe_taken(s, j, i)) continue;
                        const double v = moe_key(score, pre, l, sc, bias, g * per + i);
                        if (best < 0 || v > bk) best = i, bk = v;
                    }
                    s[j] = best;
                    gs[g] = __dadd_rn(gs[g], bk);
                }
            }
            chosen = 0ull;
            for (int j = 0; j < groupTopK; j++) {
                int best = -1;
                for (int g = 0; g < groups; g++) {
                    if (chosen >> g & 1ull) continue;
                    if (best < 0 || gs[g] > gs[best]) best = g;
                }
                chosen |= 1ull << best;
            }
        }
        const int per = groupTopK > 0 ? E / groups : E;
        for (int j = 0; j < k; j++) {
            int best = -1;
            double bk = 0.0;
            for (int e = 0; e < E; e++) {
                if (moe_taken(s, j, e)) continue;
                // experts of groups not chosen are −∞: after every chosen one
                const double v = (chosen >> (e / per) & 1ull) ? moe_key(score, pre, l, sc, bias, e) : -__longlong_as_double(0x7ff0000000000000ll);
                if (best < 0 || v > bk) best = e, bk = v;
            }
            s[j] = best;
        }
        // the probabilities of the chosen, in their order
        double m = 0.0, sum = 0.0;
        if (score == MOE_SOFTMAX && !pre) { // softmax64 over the chosen logits
            m = -__longlong_as_double(0x7ff0000000000000ll);
            for (int j = 0; j < k; j++) m = fmax(m, (double)l[s[j]]);
            for (int j = 0; j < k; j++) sum = __dadd_rn(sum, moe_exp(__dsub_rn((double)l[s[j]], m)));
        } else if (score != MOE_SOFTMAX) {
            for (int j = 0; j < k; j++) sum = __dadd_rn(sum, sc[s[j]]);
        }
        float* pr = probs + t * E;
        for (int e = 0; e < E; e++) pr[e] = 0.0f;
        for (int j = 0; j < k; j++) {
            double p;
            if (score == MOE_SOFTMAX && !pre) {
                p = __ddiv_rn(moe_exp(__dsub_rn((double)l[s[j]], m)), sum);
            } else {
                p = sc[s[j]];
                if (score != MOE_SOFTMAX && k > 1) p = __ddiv_rn(p, __dadd_rn(sum, 1e-20));
            }
            if (scaling != 0.0) p = __dmul_rn(p, scaling);
            pr[s[j]] = (float)p;
        }
    }
}

// moe_route_aux_f32: the auxiliary losses' scores of each token, q (T, E)
// float64 (compute_routing_scores_for_aux_loss: softmax over all experts,
// or the scores normalized by their sum + 1e-20), and their top-k in
// auxSel (T, k): the aux-loss map, as internal/cpu's losses.
extern "C" __global__ void moe_route_aux_f32(int* auxSel, double* q, const float* logits, long long T, int E, int k, int score) {
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (long long)gridDim.x * blockDim.x) {
        const float* l = logits + t * E;
        double* row = q + t * E;
        int* s = auxSel + t * k;
        if (score == MOE_SOFTMAX) {
            moe_softmax(row, l, E);
        } else {
            double sum = 0.0;
            for (int e = 0; e < E; e++) {
                row[e] = moe_sigmoid((double)l[e]);
                sum = __dadd_rn(sum, row[e]);
            }
            for (int e = 0; e < E; e++) row[e] = __ddiv_rn(row[e], __dadd_rn(sum, 1e-20));
        }
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                if (moe_taken(s, j, e)) continue;
                if (best < 0 || row[e] > row[best]) best = e;
            }
            s[j] = best;
        }
    }
}

// moe_route_aux_sums_f64: sums (B, E) = Σ over each sequence's S tokens of
// q, in token order (the logged loss values' part from the device).
extern "C" __global__ void moe_route_aux_sums_f64(double* sums, const double* q, long long B, long long S, int E) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < B * E; i += (long long)gridDim.x * blockDim.x) {
        const long long b = i / E, e = i - b * E;
        double acc = 0.0;
        for (long long s = 0; s < S; s++) acc = __dadd_rn(acc, q[(b * S + s) * E + e]);
        sums[i] = acc;
    }
}

// moe_route_z_f64: lse (T) float64, each token's log-sum-exp of its
// logits, the z-loss's.
extern "C" __global__ void moe_route_z_f64(double* lse, const float* logits, long long T, int E) {
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (long long)gridDim.x * blockDim.x)
        lse[t] = moe_lse(logits + t * E, E);
}

// moe_route_zsum_f64: *z = Σ lse[t]², over the T tokens in order by one
// thread (the CPU's sum, bit for bit; T products and sums, a few
// microseconds for a micro-batch's tokens).
extern "C" __global__ void moe_route_zsum_f64(double* z, const double* lse, long long T) {
    if ((long long)blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    double acc = 0.0;
    for (long long t = 0; t < T; t++) acc = __dadd_rn(acc, __dmul_rn(lse[t], lse[t]));
    *z = acc;
}

// moe_route_bwd_f32: dlogits (T, E) = RouteBackward64's gradient of the
// logits for the probabilities' gradient dprobs and, when losses (the
// losses attached, with a nonzero scale), the auxiliary losses' gradient of
// the aux scores dsc (B, E: auxScale times each loss's coefficients, summed
// over the losses in their order, constant over a sequence's seqLen tokens;
// null when there are none: zeros, added as the CPU adds them) and, when
// zloss, the z-loss's: zc (auxScale times its coefficient) · 2·lse/T times
// the softmax of the logits. float32 out; scratch as the forward's (2E
// values a token: the scores, the float64 gradient).
extern "C" __global__ void moe_route_bwd_f32(float* dlogits, double* scratch, const float* dprobs, const float* logits, const int* sel,
                                             const double* dsc, long long T, long long seqLen, int E, int k, int score, int pre,
                                             double scaling, int losses, int zloss, double zc) {
    const double sf = scaling != 0.0 ? scaling : 1.0;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += (long long)gridDim.x * blockDim.x) {
        const float* l = logits + t * E;
        const float* g = dprobs + t * E;
        const int* s = sel + t * k;
        double* sc = scratch + t * 2 * (long long)E;
        double* d = sc + E;
        for (int e = 0; e < E; e++) d[e] = 0.0;
        if (score == MOE_SOFTMAX && pre) { // softmaxBack over all E, dp at the chosen
            moe_softmax(sc, l, E);
            double dot = 0.0;
            for (int e = 0; e < E; e++) {
                double full = 0.0;
                for (int j = 0; j < k; j++)
                    if (s[j] == e) full = __dmul_rn((double)g[e], sf);
                dot = __dadd_rn(dot, __dmul_rn(sc[e], full));
            }
            for (int e = 0; e < E; e++) {
                double full = 0.0;
                for (int j = 0; j < k; j++)
                    if (s[j] == e) full = __dmul_rn((double)g[e], sf);
                d[e] = __dmul_rn(sc[e], __dsub_rn(full, dot)); // written, not added, as the CPU
            }
        } else if (score == MOE_SOFTMAX) { // softmaxBack over the chosen
            double m = -__longlong_as_double(0x7ff0000000000000ll), sum = 0.0;
            for (int j = 0; j < k; j++) m = fmax(m, (double)l[s[j]]);
            for (int j = 0; j < k; j++) {
                sc[j] = moe_exp(__dsub_rn((double)l[s[j]], m));
                sum = __dadd_rn(sum, sc[j]);
            }
            double dot = 0.0;
            for (int j = 0; j < k; j++) {
                sc[j] = __ddiv_rn(sc[j], sum);
                dot = __dadd_rn(dot, __dmul_rn(sc[j], __dmul_rn((double)g[s[j]], sf)));
            }
            for (int j = 0; j < k; j++) {
                const double dp = __dmul_rn((double)g[s[j]], sf);
                d[s[j]] = __dadd_rn(d[s[j]], __dmul_rn(sc[j], __dsub_rn(dp, dot)));
            }
        } else { // the normalized sigmoid scores of the chosen
            double sum = 0.0, dot = 0.0;
            for (int j = 0; j < k; j++) {
                sc[j] = moe_sigmoid((double)l[s[j]]);
                sum = __dadd_rn(sum, sc[j]);
            }
            const double den = __dadd_rn(sum, 1e-20);
            for (int j = 0; j < k; j++) dot = __dadd_rn(dot, __dmul_rn(__dmul_rn((double)g[s[j]], sf), sc[j]));
            for (int j = 0; j < k; j++) {
                const double dp = __dmul_rn((double)g[s[j]], sf);
                const double ds = k > 1 ? __dsub_rn(__ddiv_rn(dp, den), __ddiv_rn(dot, __dmul_rn(den, den))) : dp;
                const double sg = sc[j]; // dscore64: the same sigmoid
                d[s[j]] = __dadd_rn(d[s[j]], __dmul_rn(ds, __dmul_rn(sg, __dsub_rn(1.0, sg))));
            }
        }
        if (losses) { // the losses' gradient through the aux scores
            const double* D = dsc != nullptr ? dsc + (t / seqLen) * E : nullptr;
            if (score == MOE_SOFTMAX) {
                moe_softmax(sc, l, E);
                double dot = 0.0;
                for (int e = 0; e < E; e++) dot = __dadd_rn(dot, __dmul_rn(sc[e], D ? D[e] : 0.0));
                for (int e = 0; e < E; e++) d[e] = __dadd_rn(d[e], __dmul_rn(sc[e], __dsub_rn(D ? D[e] : 0.0, dot)));
            } else {
                double sum = 0.0, dot = 0.0;
                for (int e = 0; e < E; e++) {
                    sc[e] = moe_sigmoid((double)l[e]);
                    sum = __dadd_rn(sum, sc[e]);
                }
                const double den = __dadd_rn(sum, 1e-20);
                for (int e = 0; e < E; e++) dot = __dadd_rn(dot, __dmul_rn(D ? D[e] : 0.0, sc[e]));
                for (int e = 0; e < E; e++) {
                    const double sg = sc[e], De = D ? D[e] : 0.0;
                    const double v = __dsub_rn(__ddiv_rn(De, den), __ddiv_rn(dot, __dmul_rn(den, den)));
                    d[e] = __dadd_rn(d[e], __dmul_rn(v, __dmul_rn(sg, __dsub_rn(1.0, sg))));
                }
            }
            if (zloss) { // zc·2·lse/T times the softmax of the logits
                const double f = __ddiv_rn(__dmul_rn(__dmul_rn(zc, 2.0), moe_lse(l, E)), (double)T);
                moe_softmax(sc, l, E);
                for (int e = 0; e < E; e++) d[e] = __dadd_rn(d[e], __dmul_rn(f, sc[e]));
            }
        }
        float* out = dlogits + t * E;
        for (int e = 0; e < E; e++) out[e] = (float)d[e];
    }
}

// The permutation of the routed tokens on the device (Megatron's permute:
// the rows of each expert's tokens, expert-major, ascending within an
// expert), built from sel (T, k) so that only the experts' token counts
// go to the host: the tokens in chunks of `chunk`, moe_perm_count_i32
// counts each chunk's tokens per expert, moe_perm_scan_i32 turns those
// counts into each chunk's first row within its expert (and the expert's
// total), moe_perm_rows_i32 writes each chunk's rows there in token order.
// Integers only: the CPU's permutation (tensor's Routing.Permutation)
// exactly, whatever the chunk. With chunk the sequence length,
// moe_perm_count_i32 on the aux-loss map is seq_aux_loss's counts per
// sequence and expert.

// moe_perm_count_i32: cnt (nc, E), nc = ⌈T/chunk⌉: how many of chunk c's
// tokens have expert e among their k in sel. One thread per (c, e).
extern "C" __global__ void moe_perm_count_i32(int* cnt, const int* sel, long long T, int E, int k, long long chunk) {
    const long long nc = (T + chunk - 1) / chunk;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nc * E; i += (long long)gridDim.x * blockDim.x) {
        const long long c = i / E, end = c * chunk + chunk < T ? c * chunk + chunk : T;
        const int e = (int)(i - c * E);
        int n = 0;
        for (long long t = c * chunk; t < end; t++)
            for (int j = 0; j < k; j++) n += sel[t * k + j] == e;
        cnt[i] = n;
    }
}

// moe_perm_scan_i32: for each expert e (one thread), cnt[c][e] becomes the
// rows of e before chunk c (an exclusive sum over the chunks in order) and
// counts[e] e's rows.
extern "C" __global__ void moe_perm_scan_i32(int* counts, int* cnt, long long nc, int E) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < E; e += (long long)gridDim.x * blockDim.x) {
        int n = 0;
        for (long long c = 0; c < nc; c++) {
            const int v = cnt[c * E + e];
            cnt[c * E + e] = n;
            n += v;
        }
        counts[e] = n;
    }
}

// moe_perm_rows_i32: rows and flat (T·k): thread (c, e) writes chunk c's
// tokens routed to e, in token order, from row Σ_{e' < e} counts[e'] +
// cnt[c][e]: the token t and its probability's index t·E + e.
extern "C" __global__ void moe_perm_rows_i32(int* rows, int* flat, const int* cnt, const int* counts, const int* sel, long long T, int E,
                                             int k, long long chunk) {
    const long long nc = (T + chunk - 1) / chunk;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nc * E; i += (long long)gridDim.x * blockDim.x) {
        const long long c = i / E, end = c * chunk + chunk < T ? c * chunk + chunk : T;
        const int e = (int)(i - c * E);
        long long r = cnt[i];
        for (int a = 0; a < e; a++) r += counts[a];
        for (long long t = c * chunk; t < end; t++)
            for (int j = 0; j < k; j++)
                if (sel[t * k + j] == e) {
                    rows[r] = (int)t;
                    flat[r] = (int)(t * E + e);
                    r++;
                }
    }
}
