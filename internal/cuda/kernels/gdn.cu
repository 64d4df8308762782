// The gated delta net's kernels (tensor/cuda_backend_gdn.go): its causal
// depthwise convolution with SiLU (tensor's CausalConvSiLU), L2Norm, the
// gates, the gated delta rule (forward and backward) and the decoding runs
// of the convolution and the rule. Each value is computed as internal/cpu's
// functions compute it — the same sums in the same order, products and sums
// rounded one at a time (no fused multiply-add, as Go on amd64), the
// float64 parts in float64 — so the results are the CPU's up to the float64
// exp's (and log1p's) last bit. The bodies are __host__ __device__:
// testdata/hostcheck.cu runs them on the host against the Go code. Every
// kernel is a grid-stride loop over independent work items (an element, a
// row, a state column), so the host runs a kernel as one loop.
//
// Convolution: x (b, t, c) row-major, w (c, k): w[ch·k + k-1] weighs the
// current step.

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

__host__ __device__ __forceinline__ float gdn_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
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

__host__ __device__ __forceinline__ double gdn_dsub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

// gdn_drcp_sqrt is 1/sqrt(x) in float64, both operations correctly rounded
// (Go's 1 / math.Sqrt(x)).
__host__ __device__ __forceinline__ double gdn_drcp_sqrt(double x) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(1.0, __dsqrt_rn(x));
#else
    return 1.0 / sqrt(x);
#endif
}

// gdn_sigmoid is 1/(1+exp(-x)) in float64 (the CPU's sigmoid).
__host__ __device__ __forceinline__ double gdn_sigmoid(double x) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(1.0, __dadd_rn(1.0, exp(-x)));
#else
    return 1.0 / (1.0 + exp(-x));
#endif
}

// gdn_softplus is PyTorch's F.softplus (beta 1, threshold 20) in float64
// (internal/cpu's softplus).
__host__ __device__ __forceinline__ double gdn_softplus(double x) {
    return x > 20.0 ? x : log1p(exp(x));
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

// ---- L2Norm: x (n, d) → x / sqrt(Σx² + eps) per row (internal/cpu's
// L2NormForward, L2NormBackward). One work item a row.

__host__ __device__ __forceinline__ void gdn_l2norm_fwd_row(float* out, const float* x, long long r, int d, double eps) {
    const float* row = x + r * d;
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss = gdn_dadd(ss, gdn_dmul((double)row[j], (double)row[j]));
    const float inv = (float)gdn_drcp_sqrt(gdn_dadd(ss, eps));
    for (int j = 0; j < d; j++) out[r * d + j] = gdn_mul(row[j], inv);
}

// dx += (dy - y·(y·dy)) / sqrt(Σx² + eps), in float64 as the CPU.
__host__ __device__ __forceinline__ void gdn_l2norm_bwd_row(float* dx, const float* dy, const float* x, long long r, int d, double eps) {
    const float *row = x + r * d, *g = dy + r * d;
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss = gdn_dadd(ss, gdn_dmul((double)row[j], (double)row[j]));
    const double inv = gdn_drcp_sqrt(gdn_dadd(ss, eps));
    double dot = 0.0;
    for (int j = 0; j < d; j++) dot = gdn_dadd(dot, gdn_dmul(gdn_dmul((double)row[j], inv), (double)g[j]));
    for (int j = 0; j < d; j++) {
        const double v = gdn_dmul(inv, gdn_dsub((double)g[j], gdn_dmul(gdn_dmul((double)row[j], inv), dot)));
        dx[r * d + j] = gdn_add(dx[r * d + j], (float)v);
    }
}

extern "C" __global__ void gdn_l2norm_fwd_f32(float* out, const float* x, long long n, int d, double eps) {
    GDN_GRID_STRIDE(r, n) { gdn_l2norm_fwd_row(out, x, r, d, eps); }
}

extern "C" __global__ void gdn_l2norm_bwd_f32(float* dx, const float* dy, const float* x, long long n, int d, double eps) {
    GDN_GRID_STRIDE(r, n) { gdn_l2norm_bwd_row(dx, dy, x, r, d, eps); }
}

// ---- The gates (internal/cpu's GDNGatesForward, GDNGatesBackward): alpha,
// b, g, beta (n, h); aLog, dtBias (h). Element i = r·h + j.

__host__ __device__ __forceinline__ void gdn_gates_fwd_one(float* g, float* beta, const float* alpha, const float* b, const float* aLog,
                                                           const float* dtBias, long long i, int h) {
    const int j = (int)(i % h);
    const double z = (double)gdn_add(alpha[i], dtBias[j]);
    g[i] = (float)gdn_dmul(-exp((double)aLog[j]), gdn_softplus(z));
    beta[i] = (float)gdn_sigmoid((double)b[i]);
}

// gdn_gates_bwd_one adds element i's gradients into dalpha and db and
// leaves its terms of ddtBias and daLog (rounded to float32, as the CPU
// adds them) in tdt and taLog, which gdn_gates_sums_one adds per head in
// the CPU's order.
__host__ __device__ __forceinline__ void gdn_gates_bwd_one(float* dalpha, float* db, float* tdt, float* taLog, const float* dg, const float* dbeta,
                                                           const float* alpha, const float* b, const float* aLog, const float* dtBias, long long i,
                                                           int h) {
    const int j = (int)(i % h);
    const double a = exp((double)aLog[j]);
    const double z = (double)gdn_add(alpha[i], dtBias[j]);
    const double dsp = z <= 20.0 ? gdn_sigmoid(z) : 1.0;
    const float dz = (float)gdn_dmul(gdn_dmul(-(double)dg[i], a), dsp);
    dalpha[i] = gdn_add(dalpha[i], dz);
    tdt[i] = dz;
    taLog[i] = (float)gdn_dmul(gdn_dmul(-(double)dg[i], a), gdn_softplus(z));
    const double sg = gdn_sigmoid((double)b[i]);
    db[i] = gdn_add(db[i], (float)gdn_dmul(gdn_dmul((double)dbeta[i], sg), gdn_dsub(1.0, sg)));
}

// gdn_gates_sums_one adds head j's terms over the n rows, in row order.
__host__ __device__ __forceinline__ void gdn_gates_sums_one(float* daLog, float* ddtBias, const float* taLog, const float* tdt, long long n, int h,
                                                            int j) {
    float a = daLog[j], d = ddtBias[j];
    for (long long r = 0; r < n; r++) {
        d = gdn_add(d, tdt[r * h + j]);
        a = gdn_add(a, taLog[r * h + j]);
    }
    daLog[j] = a;
    ddtBias[j] = d;
}

// n = rows·h elements.
extern "C" __global__ void gdn_gates_fwd_f32(float* g, float* beta, const float* alpha, const float* b, const float* aLog, const float* dtBias,
                                             long long n, int h) {
    GDN_GRID_STRIDE(i, n) { gdn_gates_fwd_one(g, beta, alpha, b, aLog, dtBias, i, h); }
}

extern "C" __global__ void gdn_gates_bwd_f32(float* dalpha, float* db, float* tdt, float* taLog, const float* dg, const float* dbeta,
                                             const float* alpha, const float* b, const float* aLog, const float* dtBias, long long n, int h) {
    GDN_GRID_STRIDE(i, n) { gdn_gates_bwd_one(dalpha, db, tdt, taLog, dg, dbeta, alpha, b, aLog, dtBias, i, h); }
}

// rows = n/h; one work item a head.
extern "C" __global__ void gdn_gates_sums_f32(float* daLog, float* ddtBias, const float* taLog, const float* tdt, long long rows, int h) {
    GDN_GRID_STRIDE(j, h) { gdn_gates_sums_one(daLog, ddtBias, taLog, tdt, rows, h, (int)j); }
}

// ---- The gated delta rule, by its recurrence (internal/cpu's
// GatedDeltaRuleForward, GatedDeltaRuleBackward, GatedDeltaRuleStateForward),
// for both of tensor's GatedDeltaRule (whose CPU form is chunked: equal
// within float32 rounding) and GatedDeltaRuleRecurrent (bit for bit):
// q, k (B, T, H, dk) with the key heads already repeated to the H value
// heads, v, out (B, T, H, dv), g, beta (B, T, H); the state S of sequence i
// and head h (p = i·H + h) is dk×dv, row-major. The recurrence's columns are
// independent (u = Sᵀk, δ and the update act column by column), so one work
// item is one column c of one state: p·dv + c, looping over the steps. The
// backward's sums across columns (dq, dk, dbeta, dg) run as separate work
// items over the chunk's recomputed states, in the CPU's order.

// gdn_delta_step_col advances column S[0], S[dv], ..., S[(dk-1)·dv] by
// one step with key kt, query qt (nullptr: no output), value vc, log-decay
// gt and strength bt, and returns the step's output: the CPU's deltaStep
// for one column.
__host__ __device__ __forceinline__ float gdn_delta_step_col(float* S, int dv, const float* kt, const float* qt, float vc, float gt, float bt,
                                                             float sc, int dk) {
    const float decay = (float)exp((double)gt);
    float u = 0.0f;
    for (int a = 0; a < dk; a++) u = gdn_add(u, gdn_mul(S[(long long)a * dv], gdn_mul(kt[a], decay)));
    const float delta = gdn_mul(bt, gdn_sub(vc, u));
    float o = 0.0f;
    for (int a = 0; a < dk; a++) {
        const float x = gdn_add(gdn_mul(S[(long long)a * dv], decay), gdn_mul(kt[a], delta));
        S[(long long)a * dv] = x;
        if (qt) o = gdn_add(o, gdn_mul(x, gdn_mul(qt[a], sc)));
    }
    return o;
}

// gdn_delta_fwd_col runs column e = p·dv + c over the T steps from a zero
// state (state: B·H·dk·dv, the columns' working copies), writing out and
// the state before steps 0, chunk, 2·chunk, ... into saved
// (B·H·ceil(T/chunk)·dk·dv, the CPU's layout).
__host__ __device__ __forceinline__ void gdn_delta_fwd_col(float* out, float* saved, float* state, const float* q, const float* k, const float* v,
                                                           const float* g, const float* beta, long long e, int T, int H, int dk, int dv,
                                                           float sc, int chunk) {
    const long long p = e / dv, i = p / H;
    const int c = (int)(e - p * dv), h = (int)(p % H);
    const long long nc = (T + chunk - 1) / chunk, sz = (long long)dk * dv;
    float* S = state + p * sz + c;
    for (int a = 0; a < dk; a++) S[(long long)a * dv] = 0.0f;
    for (int t = 0; t < T; t++) {
        if (t % chunk == 0) {
            float* dst = saved + (p * nc + t / chunk) * sz + c;
            for (int a = 0; a < dk; a++) dst[(long long)a * dv] = S[(long long)a * dv];
        }
        const long long row = (i * T + t) * H + h;
        out[row * dv + c] = gdn_delta_step_col(S, dv, k + row * dk, q + row * dk, v[row * dv + c], g[row], beta[row], sc, dk);
    }
}

// The backward walks the chunks from the last; for chunk ci (steps t0 =
// ci·chunk to t0+L-1) three passes: the chunk's states (states: per p,
// chunk+1 states, the one before each step and the last one after),
// the columns' reverse sweep carrying dS (per p, dk×dv, zero before the
// last chunk) and leaving per step the dS it used (dS1, per p chunk
// states), u and dδ (us, dds: per p chunk·dv), then the rows' sums.

__host__ __device__ __forceinline__ void gdn_delta_states_col(float* states, const float* saved, const float* k, const float* v, const float* g,
                                                              const float* beta, long long e, int T, int H, int dk, int dv, int chunk, int ci) {
    const long long p = e / dv, i = p / H;
    const int c = (int)(e - p * dv), h = (int)(p % H);
    const long long nc = (T + chunk - 1) / chunk, sz = (long long)dk * dv;
    const int t0 = ci * chunk, L = T - t0 < chunk ? T - t0 : chunk;
    float* St = states + p * (chunk + 1) * sz + c;
    const float* src = saved + (p * nc + ci) * sz + c;
    for (int a = 0; a < dk; a++) St[(long long)a * dv] = src[(long long)a * dv];
    for (int j = 0; j < L; j++) {
        float* next = St + (j + 1) * sz;
        for (int a = 0; a < dk; a++) next[(long long)a * dv] = St[j * sz + (long long)a * dv];
        const long long row = (i * T + t0 + j) * H + h;
        gdn_delta_step_col(next, dv, k + row * dk, nullptr, v[row * dv + c], g[row], beta[row], 0.0f, dk);
    }
}

__host__ __device__ __forceinline__ void gdn_delta_sweep_col(float* dS, float* dS1, float* us, float* dds, float* dvOut, const float* states,
                                                             const float* q, const float* k, const float* v, const float* g,
                                                             const float* beta, const float* dout, long long e, int T, int H, int dk, int dv,
                                                             float sc, int chunk, int ci) {
    const long long p = e / dv, i = p / H;
    const int c = (int)(e - p * dv), h = (int)(p % H);
    const long long sz = (long long)dk * dv;
    const int t0 = ci * chunk, L = T - t0 < chunk ? T - t0 : chunk;
    float* D = dS + p * sz + c;
    for (int j = L - 1; j >= 0; j--) {
        const long long row = (i * T + t0 + j) * H + h;
        const float *prev = states + p * (chunk + 1) * sz + j * sz + c, *qt = q + row * dk, *kt = k + row * dk;
        float* D1 = dS1 + p * chunk * sz + j * sz + c;
        const float decay = (float)exp((double)g[row]), bt = beta[row], doc = dout[row * dv + c];
        float u = 0.0f;
        for (int a = 0; a < dk; a++) {
            u = gdn_add(u, gdn_mul(prev[(long long)a * dv], gdn_mul(decay, kt[a])));
            const float d = gdn_add(D[(long long)a * dv], gdn_mul(gdn_mul(sc, qt[a]), doc));
            D[(long long)a * dv] = d;
            D1[(long long)a * dv] = d;
        }
        float ddelta = 0.0f;
        for (int a = 0; a < dk; a++) ddelta = gdn_add(ddelta, gdn_mul(D[(long long)a * dv], kt[a]));
        dvOut[row * dv + c] = gdn_add(dvOut[row * dv + c], gdn_mul(bt, ddelta));
        us[(p * chunk + j) * dv + c] = u;
        dds[(p * chunk + j) * dv + c] = ddelta;
        const float du = gdn_mul(ddelta, -bt);
        for (int a = 0; a < dk; a++) D[(long long)a * dv] = gdn_mul(decay, gdn_add(D[(long long)a * dv], gdn_mul(kt[a], du)));
    }
}

// gdn_delta_rowsums_one is work item e = (p·chunk + j)·dk + a: dq and dk
// of step t0+j, key dimension a.
__host__ __device__ __forceinline__ void gdn_delta_rowsums_one(float* dq, float* dk_, const float* states, const float* dS1, const float* us,
                                                               const float* dds, const float* q, const float* k, const float* v,
                                                               const float* g, const float* beta, const float* dout, long long e, int T, int H,
                                                               int dk, int dv, float sc, int chunk, int ci) {
    const int a = (int)(e % dk);
    const long long pj = e / dk, p = pj / chunk, i = p / H;
    const int j = (int)(pj % chunk), h = (int)(p % H), t0 = ci * chunk;
    if (t0 + j >= T) return;
    const long long sz = (long long)dk * dv, row = (i * T + t0 + j) * H + h;
    const float* prev = states + p * (chunk + 1) * sz + j * sz + (long long)a * dv;
    const float* cur = prev + sz;
    const float* d1 = dS1 + p * chunk * sz + j * sz + (long long)a * dv;
    const float *u = us + (p * chunk + j) * dv, *dd = dds + (p * chunk + j) * dv, *vt = v + row * dv, *dot = dout + row * dv;
    const float decay = (float)exp((double)g[row]), bt = beta[row];
    float acc = 0.0f;
    for (int c = 0; c < dv; c++) acc = gdn_add(acc, gdn_mul(cur[c], dot[c]));
    dq[row * dk + a] = gdn_add(dq[row * dk + a], gdn_mul(sc, acc));
    acc = 0.0f;
    for (int c = 0; c < dv; c++) acc = gdn_add(acc, gdn_mul(d1[c], gdn_mul(bt, gdn_sub(vt[c], u[c]))));
    float dka = gdn_add(dk_[row * dk + a], acc);
    acc = 0.0f;
    for (int c = 0; c < dv; c++) acc = gdn_add(acc, gdn_mul(gdn_mul(decay, prev[c]), gdn_mul(dd[c], -bt)));
    dk_[row * dk + a] = gdn_add(dka, acc);
}

// gdn_delta_stepsums_one is work item e = p·chunk + j: dbeta and dg of
// step t0+j.
__host__ __device__ __forceinline__ void gdn_delta_stepsums_one(float* dg, float* dbeta, const float* states, const float* dS1, const float* us,
                                                                const float* dds, const float* k, const float* v, const float* g,
                                                                const float* beta, long long e, int T, int H, int dk, int dv, int chunk, int ci) {
    const long long p = e / chunk, i = p / H;
    const int j = (int)(e % chunk), h = (int)(p % H), t0 = ci * chunk;
    if (t0 + j >= T) return;
    const long long sz = (long long)dk * dv, row = (i * T + t0 + j) * H + h;
    const float* prev = states + p * (chunk + 1) * sz + j * sz;
    const float* d1 = dS1 + p * chunk * sz + j * sz;
    const float *u = us + (p * chunk + j) * dv, *dd = dds + (p * chunk + j) * dv, *vt = v + row * dv, *kt = k + row * dk;
    const float decay = (float)exp((double)g[row]), bt = beta[row];
    float dbt = 0.0f;
    for (int c = 0; c < dv; c++) dbt = gdn_add(dbt, gdn_mul(dd[c], gdn_sub(vt[c], u[c])));
    dbeta[row] = gdn_add(dbeta[row], dbt);
    float dgt = 0.0f;
    for (int a = 0; a < dk; a++) {
        for (int c = 0; c < dv; c++) {
            const float x = gdn_add(d1[(long long)a * dv + c], gdn_mul(kt[a], gdn_mul(dd[c], -bt)));
            dgt = gdn_add(dgt, gdn_mul(gdn_mul(decay, prev[(long long)a * dv + c]), x));
        }
    }
    dg[row] = gdn_add(dg[row], dgt);
}

// n = B·H·dv columns.
extern "C" __global__ void gdn_delta_fwd_f32(float* out, float* saved, float* state, const float* q, const float* k, const float* v,
                                             const float* g, const float* beta, long long n, int T, int H, int dk, int dv, float sc, int chunk) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_fwd_col(out, saved, state, q, k, v, g, beta, e, T, H, dk, dv, sc, chunk); }
}

extern "C" __global__ void gdn_delta_states_f32(float* states, const float* saved, const float* k, const float* v, const float* g,
                                                const float* beta, long long n, int T, int H, int dk, int dv, int chunk, int ci) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_states_col(states, saved, k, v, g, beta, e, T, H, dk, dv, chunk, ci); }
}

extern "C" __global__ void gdn_delta_sweep_f32(float* dS, float* dS1, float* us, float* dds, float* dvOut, const float* states, const float* q,
                                               const float* k, const float* v, const float* g, const float* beta, const float* dout, long long n,
                                               int T, int H, int dk, int dv, float sc, int chunk, int ci) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_sweep_col(dS, dS1, us, dds, dvOut, states, q, k, v, g, beta, dout, e, T, H, dk, dv, sc, chunk, ci); }
}

// n = B·H·chunk·dk.
extern "C" __global__ void gdn_delta_rowsums_f32(float* dq, float* dk_, const float* states, const float* dS1, const float* us, const float* dds,
                                                 const float* q, const float* k, const float* v, const float* g, const float* beta,
                                                 const float* dout, long long n, int T, int H, int dk, int dv, float sc, int chunk, int ci) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_rowsums_one(dq, dk_, states, dS1, us, dds, q, k, v, g, beta, dout, e, T, H, dk, dv, sc, chunk, ci); }
}

// n = B·H·chunk.
extern "C" __global__ void gdn_delta_stepsums_f32(float* dg, float* dbeta, const float* states, const float* dS1, const float* us,
                                                  const float* dds, const float* k, const float* v, const float* g, const float* beta, long long n,
                                                  int T, int H, int dk, int dv, int chunk, int ci) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_stepsums_one(dg, dbeta, states, dS1, us, dds, k, v, g, beta, e, T, H, dk, dv, chunk, ci); }
}

// ---- Key heads repeated to the value heads (tensor's deltaRule.repeat)
// and their gradients folded back (deltaRule.fold): x (rows, kh, d), the
// repeated (rows, H, d), value head h reading key head h/(H/kh).

__host__ __device__ __forceinline__ float gdn_repeat_one(const float* x, long long e, int kh, int H, int d) {
    const int j = (int)(e % d);
    const long long rh = e / d, row = rh / H;
    const int h = (int)(rh % H);
    return x[(row * kh + h / (H / kh)) * d + j];
}

// dx element e = (row·kh + m)·d + j adds the r = H/kh repeated heads'
// gradients in head order.
__host__ __device__ __forceinline__ float gdn_fold_one(const float* dx, const float* dr, long long e, int kh, int H, int d) {
    const int j = (int)(e % d), r = H / kh;
    const long long rm = e / d, row = rm / kh;
    const int m = (int)(rm % kh);
    float acc = dx[e];
    for (int h = m * r; h < (m + 1) * r; h++) acc = gdn_add(acc, dr[(row * H + h) * d + j]);
    return acc;
}

// n = rows·H·d.
extern "C" __global__ void gdn_repeat_heads_f32(float* out, const float* x, long long n, int kh, int H, int d) {
    GDN_GRID_STRIDE(e, n) { out[e] = gdn_repeat_one(x, e, kh, H, d); }
}

// n = rows·kh·d.
extern "C" __global__ void gdn_fold_heads_f32(float* dx, const float* dr, long long n, int kh, int H, int d) {
    GDN_GRID_STRIDE(e, n) { dx[e] = gdn_fold_one(dx, dr, e, kh, H, d); }
}

// ---- Decoding: a step's tokens are runs of sequences (starts: nruns+1
// token offsets), each continuing from its state, which the kernels
// advance (internal/cpu's CausalConvSiLUStateForward and
// GatedDeltaRuleStateForward). x (n, c); conv states (nruns, k-1, c);
// rule states (nruns, H, dk, dv); q, k (n, H, dk) repeated; v (n, H, dv);
// g, beta (n, H).

// gdn_conv_runs_col runs channel ch of one run (tokens r0 .. r0+t-1 of
// x) from its state st (the run's (k-1, c) window, offset to channel ch),
// then leaves the channel's new window in st.
__host__ __device__ __forceinline__ void gdn_conv_runs_col(float* out, float* st, const float* x, const float* w, long long r0, int t, int ch,
                                                           int c, int k) {
    const int hw = k - 1;
    for (int s = 0; s < t; s++) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const int src = s - hw + j;
            const float xv = src < 0 ? st[(long long)(hw + src) * c] : x[(r0 + src) * c + ch];
            acc = gdn_add(acc, gdn_mul(w[(long long)ch * k + j], xv));
        }
        out[(r0 + s) * c + ch] = acc / gdn_add(1.0f, (float)exp(-(double)acc));
    }
    for (int m = 0; m < hw; m++) {
        const int src = t - hw + m; // position in this run's tokens; < 0: the old window
        st[(long long)m * c] = src < 0 ? st[(long long)(hw + src) * c] : x[(r0 + src) * c + ch];
    }
}

// gdn_conv_runs_one is work item e = r·c + ch with the runs' states packed
// run after run.
__host__ __device__ __forceinline__ void gdn_conv_runs_one(float* out, float* state, const float* x, const float* w, const int* starts,
                                                           long long e, int c, int k) {
    const long long r = e / c;
    const int ch = (int)(e - r * c);
    gdn_conv_runs_col(out, state + r * (k - 1) * c + ch, x, w, starts[r], starts[r + 1] - starts[r], ch, c, k);
}

// gdn_delta_runs_col runs column c of head h of one run (tokens starts
// .. end-1) from its state S (the run's (H, dk, dv) state, offset to head
// h's column c).
__host__ __device__ __forceinline__ void gdn_delta_runs_col(float* out, float* S, const float* q, const float* k, const float* v, const float* g,
                                                            const float* beta, long long t0, long long t1, int h, int c, int H, int dk, int dv,
                                                            float sc) {
    for (long long t = t0; t < t1; t++) {
        const long long row = t * H + h;
        out[row * dv + c] = gdn_delta_step_col(S, dv, k + row * dk, q + row * dk, v[row * dv + c], g[row], beta[row], sc, dk);
    }
}

// gdn_delta_runs_one is work item e = (r·H + h)·dv + c with the runs'
// states packed run after run.
__host__ __device__ __forceinline__ void gdn_delta_runs_one(float* out, float* state, const float* q, const float* k, const float* v,
                                                            const float* g, const float* beta, const int* starts, long long e, int H, int dk,
                                                            int dv, float sc) {
    const long long rh = e / dv, r = rh / H;
    const int c = (int)(e - rh * dv), h = (int)(rh % H);
    gdn_delta_runs_col(out, state + rh * dk * dv + c, q, k, v, g, beta, starts[r], starts[r + 1], h, c, H, dk, dv, sc);
}

// n = nruns·c.
extern "C" __global__ void gdn_conv_runs_f32(float* out, float* state, const float* x, const float* w, const int* starts, long long n, int c,
                                             int k) {
    GDN_GRID_STRIDE(e, n) { gdn_conv_runs_one(out, state, x, w, starts, e, c, k); }
}

// n = nruns·H·dv.
extern "C" __global__ void gdn_delta_runs_f32(float* out, float* state, const float* q, const float* k, const float* v, const float* g,
                                              const float* beta, const int* starts, long long n, int H, int dk, int dv, float sc) {
    GDN_GRID_STRIDE(e, n) { gdn_delta_runs_one(out, state, q, k, v, g, beta, starts, e, H, dk, dv, sc); }
}

// The same with each run's state where the sequence keeps it on the device
// (statePtrs: one device address a run), advanced in place: no copy of
// the states a step.

// n = nruns·c.
extern "C" __global__ void gdn_conv_runs_ptr_f32(float* out, const unsigned long long* statePtrs, const float* x, const float* w,
                                                 const int* starts, long long n, int c, int k) {
    GDN_GRID_STRIDE(e, n) {
        const long long r = e / c;
        const int ch = (int)(e - r * c);
        gdn_conv_runs_col(out, (float*)statePtrs[r] + ch, x, w, starts[r], starts[r + 1] - starts[r], ch, c, k);
    }
}

// n = nruns·H·dv.
extern "C" __global__ void gdn_delta_runs_ptr_f32(float* out, const unsigned long long* statePtrs, const float* q, const float* k,
                                                  const float* v, const float* g, const float* beta, const int* starts, long long n, int H, int dk,
                                                  int dv, float sc) {
    GDN_GRID_STRIDE(e, n) {
        const long long rh = e / dv, r = rh / H;
        const int c = (int)(e - rh * dv), h = (int)(rh % H);
        gdn_delta_runs_col(out, (float*)statePtrs[r] + (long long)h * dk * dv + c, q, k, v, g, beta, starts[r], starts[r + 1], h, c, H, dk, dv,
                           sc);
    }
}
