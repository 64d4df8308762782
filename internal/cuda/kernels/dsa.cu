// DeepSeek sparse attention's kernels (tensor/cuda_backend_dsa.go): the
// lightning indexer's Hadamard rotation, the combination of its heads'
// products into causal scores, its top-k selection (a bitonic sort of each
// row's keys), and the row-wise work of the attention over the selected
// keys, of the indexer loss's target and of the loss itself. cuBLAS
// computes every product (the indexer's q·kᵀ per chunk of queries, the
// attention's S = scale·q·kᵀ, P·V and the backward's products per head, on
// rows of (T, T) scores as the materialized attention's): these kernels do
// what lies between, each row by one thread, as internal/cpu's DSA
// functions do it — the sums over keys and channels in float64 where the
// CPU's are. The CPU computes the products as float64 dots, so the results
// agree within float32 rounding, not bit for bit; the top-k selection of
// given scores is the CPU's exactly (torch.topk's order: decreasing score,
// ties by the earlier key). The bodies are __host__ __device__:
// testdata/hostcheck.cu runs them on the host (TestHostDSA*).
//
// Layouts (row-major): the indexer's q (B, T, H, D), k (B, T, D), w (B, T,
// H); scores (B, T, T); idx (B, T, K), -1 past a row's keys; the
// attention's q, k (B, T, N, dk), v, out (B, T, N, dv), lse (B, T, N); a
// chunk of scores S (hc, T, T) for heads h0 .. h0+hc-1 of batch row b.

#include <stdint.h>

#define DSA_GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

__host__ __device__ __forceinline__ float dsa_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float dsa_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

__host__ __device__ __forceinline__ double dsa_dadd(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

__host__ __device__ __forceinline__ double dsa_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ uint32_t dsa_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

__host__ __device__ __forceinline__ float dsa_neg_inf() {
#ifdef __CUDA_ARCH__
    return __uint_as_float(0xFF800000u);
#else
    const uint32_t u = 0xFF800000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

__host__ __device__ __forceinline__ bool dsa_is_neg_inf(float f) { return dsa_bits(f) == 0xFF800000u; }

// ---- The Hadamard rotation (internal/cpu's HadamardTransform): row r of
// d channels, d a power of two, through scratch (n·d float64).

__host__ __device__ __forceinline__ void dsa_hadamard_row(float* out, const float* x, double* scratch, long long r, int d, double scale) {
    double* buf = scratch + r * d;
    for (int c = 0; c < d; c++) buf[c] = (double)x[r * d + c];
    for (int h = 1; h < d; h *= 2) {
        for (int i = 0; i < d; i += 2 * h) {
            for (int j = i; j < i + h; j++) {
                const double a = buf[j], b = buf[j + h];
                buf[j] = dsa_dadd(a, b);
                buf[j + h] = dsa_dadd(a, -b);
            }
        }
    }
    for (int c = 0; c < d; c++) out[r * d + c] = (float)dsa_dmul(buf[c], scale);
}

extern "C" __global__ void dsa_hadamard_f32(float* out, const float* x, double* scratch, long long n, int d, double scale) {
    DSA_GRID_STRIDE(r, n) { dsa_hadamard_row(out, x, scratch, r, d, scale); }
}

// ---- The indexer's scores from one chunk of queries' products p (rows
// queries i0 .. i0+rows-1 of batch row b, p (rows·H, T) = q·kᵀ): element e
// = r·T + j of the chunk, internal/cpu's IndexerScoresGEMM's sum over heads
// in float32, -Inf above the diagonal.

__host__ __device__ __forceinline__ float dsa_combine_one(const float* p, const float* w, long long e, int b, int i0, int T, int H, int relu) {
    const long long r = e / T;
    const int j = (int)(e - r * T), i = i0 + (int)r;
    if (j > i) return dsa_neg_inf();
    float acc = 0.0f;
    for (int h = 0; h < H; h++) {
        const float v = p[(r * H + h) * T + j];
        if (relu && v < 0.0f) continue;
        acc = dsa_add(acc, dsa_mul(w[((long long)b * T + i) * H + h], v));
    }
    return acc;
}

// n = rows·T.
extern "C" __global__ void dsa_index_combine_f32(float* scores, const float* p, const float* w, long long n, int b, int i0, int T, int H,
                                                 int relu) {
    DSA_GRID_STRIDE(e, n) { scores[((long long)b * T + i0) * T + e] = dsa_combine_one(p, w, e, b, i0, T, H, relu); }
}

// ---- Top-k by a bitonic sort of each row's keys: key (score descending,
// then key position ascending) as an unsigned 64-bit integer sorted
// ascending; positions past T (the row padded to tp, a power of two) sort
// last.

// dsa_desc32 maps float f to a 32-bit integer that increases as f
// decreases (the usual order-preserving map, inverted).
__host__ __device__ __forceinline__ uint32_t dsa_desc32(float f) {
    const uint32_t u = dsa_bits(f);
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~asc;
}

__host__ __device__ __forceinline__ uint64_t dsa_topk_key(const float* scores, long long e, int T, int tp) {
    const long long row = e / tp;
    const int j = (int)(e - row * tp);
    if (j >= T) return ~(uint64_t)0;
    return ((uint64_t)dsa_desc32(scores[row * T + j]) << 32) | (uint32_t)j;
}

// one compare-exchange of the bitonic network's stage (k, jj) at element e
// (rows·tp elements).
__host__ __device__ __forceinline__ void dsa_bitonic_one(uint64_t* keys, long long e, int tp, int k, int jj) {
    const long long row = e / tp;
    const int i = (int)(e - row * tp), l = i ^ jj;
    if (l <= i) return;
    uint64_t* base = keys + row * tp;
    const uint64_t a = base[i], b = base[l];
    const bool up = (i & k) == 0;
    if ((a > b) == up) {
        base[i] = b;
        base[l] = a;
    }
}

// idx[row·K + c]: the c-th sorted key's position, -1 when its score is
// -Inf (masked) or past T.
__host__ __device__ __forceinline__ int dsa_topk_out_one(const uint64_t* keys, long long e, int tp, int K) {
    const long long row = e / K;
    const int c = (int)(e - row * K);
    const uint64_t key = keys[row * tp + c];
    if ((uint32_t)(key >> 32) == dsa_desc32(dsa_neg_inf()) || key == ~(uint64_t)0) return -1;
    return (int)(uint32_t)key;
}

// n = rows·tp.
extern "C" __global__ void dsa_topk_keys_u64(uint64_t* keys, const float* scores, long long n, int T, int tp) {
    DSA_GRID_STRIDE(e, n) { keys[e] = dsa_topk_key(scores, e, T, tp); }
}

extern "C" __global__ void dsa_bitonic_u64(uint64_t* keys, long long n, int tp, int k, int jj) {
    DSA_GRID_STRIDE(e, n) { dsa_bitonic_one(keys, e, tp, k, jj); }
}

// n = rows·K.
extern "C" __global__ void dsa_topk_out_i32(int* idx, const uint64_t* keys, long long n, int tp, int K) {
    DSA_GRID_STRIDE(e, n) { idx[e] = dsa_topk_out_one(keys, e, tp, K); }
}

// ---- The attention over the selected keys, on a chunk S (hc, T, T) of
// scale·q·kᵀ for heads h0.. of batch row b: row e = hh·T + i.

// dsa_sparse_fwd_row turns row e of S into the probabilities over the
// keys query i selected (0 elsewhere) and writes lse (-Inf and a zero row
// for a query with no key): internal/cpu's SparseAttentionForward. pk
// (hc·T, K) holds the row's selected probabilities while the row clears.
__host__ __device__ __forceinline__ void dsa_sparse_fwd_row(float* S, float* lse, float* pk, const int* idx, long long e, int b, int h0, int T,
                                                         int N, int K) {
    const long long hh = e / T;
    const int i = (int)(e - hh * T);
    float *row = S + e * T, *pr = pk + e * K;
    const int* sel = idx + ((long long)b * T + i) * K;
    double m = (double)dsa_neg_inf();
    for (int c = 0; c < K; c++) {
        if (sel[c] >= 0 && (double)row[sel[c]] > m) m = (double)row[sel[c]];
    }
    double l = 0.0;
    for (int c = 0; c < K; c++) {
        if (sel[c] >= 0) l = dsa_dadd(l, exp(dsa_dadd((double)row[sel[c]], -m)));
    }
    float* ls = lse + ((long long)b * T + i) * N + h0 + hh;
    for (int c = 0; c < K; c++) pr[c] = (sel[c] >= 0 && l != 0.0) ? (float)(exp(dsa_dadd((double)row[sel[c]], -m)) / l) : 0.0f;
    for (int j = 0; j < T; j++) row[j] = 0.0f;
    for (int c = 0; c < K; c++) {
        if (sel[c] >= 0) row[sel[c]] = pr[c];
    }
    *ls = l == 0.0 ? dsa_neg_inf() : (float)(m + log(l));
}

// dsa_sparse_probs_row is the backward's P: exp(S - lse) on the selected
// keys, 0 elsewhere (internal/cpu's SparseAttentionBackward's p), through
// pk as the forward.
__host__ __device__ __forceinline__ void dsa_sparse_probs_row(float* S, const float* lse, float* pk, const int* idx, long long e, int b, int h0,
                                                           int T, int N, int K) {
    const long long hh = e / T;
    const int i = (int)(e - hh * T);
    float *row = S + e * T, *pr = pk + e * K;
    const int* sel = idx + ((long long)b * T + i) * K;
    const float ls = lse[((long long)b * T + i) * N + h0 + hh];
    const bool none = dsa_is_neg_inf(ls);
    for (int c = 0; c < K; c++) pr[c] = (sel[c] >= 0 && !none) ? (float)exp(dsa_dadd((double)row[sel[c]], -(double)ls)) : 0.0f;
    for (int j = 0; j < T; j++) row[j] = 0.0f;
    for (int c = 0; c < K; c++) {
        if (sel[c] >= 0) row[sel[c]] = pr[c];
    }
}

// dsa_sparse_ds_row turns row e of dP (dO·Vᵀ) into dS = P·(dP - δ)·scale,
// δ = dO·O (float64 over dv), 0 where P is.
__host__ __device__ __forceinline__ void dsa_sparse_ds_row(float* dP, const float* P, const float* dout, const float* out, long long e, int b,
                                                        int h0, int T, int N, int dv, float scale) {
    const long long hh = e / T;
    const int i = (int)(e - hh * T);
    const long long o = (((long long)b * T + i) * N + h0 + hh) * dv;
    double delta = 0.0;
    for (int c = 0; c < dv; c++) delta = dsa_dadd(delta, dsa_dmul((double)dout[o + c], (double)out[o + c]));
    float* row = dP + e * T;
    const float* p = P + e * T;
    for (int j = 0; j < T; j++) {
        row[j] = p[j] == 0.0f ? 0.0f : (float)dsa_dmul(dsa_dmul((double)p[j], dsa_dadd((double)row[j], -delta)), (double)scale);
    }
}

// n = hc·T rows.
extern "C" __global__ void dsa_sparse_fwd_f32(float* S, float* lse, float* pk, const int* idx, long long n, int b, int h0, int T, int N, int K) {
    DSA_GRID_STRIDE(e, n) { dsa_sparse_fwd_row(S, lse, pk, idx, e, b, h0, T, N, K); }
}

extern "C" __global__ void dsa_sparse_probs_f32(float* S, const float* lse, float* pk, const int* idx, long long n, int b, int h0, int T, int N,
                                                int K) {
    DSA_GRID_STRIDE(e, n) { dsa_sparse_probs_row(S, lse, pk, idx, e, b, h0, T, N, K); }
}

extern "C" __global__ void dsa_sparse_ds_f32(float* dP, const float* P, const float* dout, const float* out, long long n, int b, int h0, int T,
                                             int N, int dv, float scale) {
    DSA_GRID_STRIDE(e, n) { dsa_sparse_ds_row(dP, P, dout, out, e, b, h0, T, N, dv, scale); }
}

// ---- The indexer loss's target: row i of batch row b adds, for each
// head of the chunk S (hc, T, T) in order, the softmax of its scores over
// the causal keys (sparse: the causal keys idx selects) clamped as
// masked_softmax (internal/cpu's IndexerTargetHeads).

__host__ __device__ __forceinline__ void dsa_target_row(float* target, const float* S, const int* idx, long long i, int b, int hc, int T, int K,
                                                        int sparse) {
    float* out = target + ((long long)b * T + i) * T;
    const int* sel = idx + ((long long)b * T + i) * K;
    const int n = sparse ? K : (int)i + 1;
    for (int hh = 0; hh < hc; hh++) {
        const float* row = S + ((long long)hh * T + i) * T;
        double m = (double)dsa_neg_inf();
        for (int c = 0; c < n; c++) {
            const int j = sparse ? sel[c] : c;
            if (j >= 0 && j <= i && (double)row[j] > m) m = (double)row[j];
        }
        double l = 0.0;
        for (int c = 0; c < n; c++) {
            const int j = sparse ? sel[c] : c;
            if (j >= 0 && j <= i) l = dsa_dadd(l, exp(dsa_dadd((double)row[j], -m)));
        }
        if (l < 1e-10) l = 1e-10;
        for (int c = 0; c < n; c++) {
            const int j = sparse ? sel[c] : c;
            if (j >= 0 && j <= i) out[j] = dsa_add(out[j], (float)(exp(dsa_dadd((double)row[j], -m)) / l));
        }
    }
}

// n = T rows.
extern "C" __global__ void dsa_target_f32(float* target, const float* S, const int* idx, long long n, int b, int hc, int T, int K, int sparse) {
    DSA_GRID_STRIDE(i, n) { dsa_target_row(target, S, idx, i, b, hc, T, K, sparse); }
}

// ---- The indexer's KL loss per row r = b·T + i (internal/cpu's
// IndexerLoss): the target row normalised in place (0 off the covered
// keys), dlogits = (softmax(scores) - target)/div on the covered keys (0
// elsewhere), and the row's KL into rowLoss. dlogits' row first marks the
// covered keys (1), so that a sparse row's keys are found once.

__host__ __device__ __forceinline__ void dsa_loss_row(float* dlogits, double* rowLoss, float* target, const float* scores, const int* idx,
                                                      long long r, int T, int K, int sparse, double div) {
    const int i = (int)(r % T);
    float *tg = target + r * T, *d = dlogits + r * T;
    const float* s = scores + r * T;
    for (int j = 0; j < T; j++) d[j] = (!sparse && j <= i) ? 1.0f : 0.0f;
    if (sparse) {
        const int* sel = idx + r * K;
        for (int c = 0; c < K; c++) {
            if (sel[c] >= 0 && sel[c] <= i) d[sel[c]] = 1.0f;
        }
    }
    double sum = 0.0, m = (double)dsa_neg_inf();
    for (int j = 0; j < T; j++) {
        if (d[j] != 0.0f) {
            sum = dsa_dadd(sum, (double)tg[j]);
            if ((double)s[j] > m) m = (double)s[j];
        }
    }
    if (sum < 1e-10) sum = 1e-10;
    double l = 0.0;
    for (int j = 0; j < T; j++) {
        if (d[j] != 0.0f) l = dsa_dadd(l, exp(dsa_dadd((double)s[j], -m)));
    }
    const double lse = m + log(l);
    double kl = 0.0;
    for (int j = 0; j < T; j++) {
        if (d[j] == 0.0f) {
            tg[j] = 0.0f;
            continue;
        }
        tg[j] = (float)((double)tg[j] / sum);
        const double tj = (double)tg[j], logp = dsa_dadd((double)s[j], -lse);
        kl = dsa_dadd(kl, dsa_dmul(tj, dsa_dadd(log(tj > 1e-10 ? tj : 1e-10), -logp)));
        d[j] = (float)((exp(logp) - tj) / div);
    }
    rowLoss[r] = kl;
}

// n = B·T rows.
extern "C" __global__ void dsa_loss_f32(float* dlogits, double* rowLoss, float* target, const float* scores, const int* idx, long long n, int T,
                                        int K, int sparse, double div) {
    DSA_GRID_STRIDE(r, n) { dsa_loss_row(dlogits, rowLoss, target, scores, idx, r, T, K, sparse, div); }
}

// ---- The indexer's backward on one chunk of queries' products p (rows·H,
// T), as internal/cpu's IndexerScoresBackwardGEMM: row e = r·H + h of p
// becomes the products' gradient ds·w (0 where ReLU cut the product and
// above the diagonal), and dw gains Σ_j ds·p.

__host__ __device__ __forceinline__ void dsa_index_bwd_row(float* p, float* dw, const float* ds, const float* w, long long e, int b, int i0, int T,
                                                         int H, int relu) {
    const long long r = e / H;
    const int h = (int)(e - r * H), i = i0 + (int)r;
    float* pr = p + e * T;
    const float* g = ds + ((long long)b * T + i) * T;
    const long long wi = ((long long)b * T + i) * H + h;
    const float wh = w[wi];
    float gw = 0.0f;
    for (int j = 0; j <= i; j++) {
        const float v = pr[j];
        if (relu && v <= 0.0f) {
            pr[j] = 0.0f;
            continue;
        }
        gw = dsa_add(gw, dsa_mul(g[j], v));
        pr[j] = dsa_mul(g[j], wh);
    }
    for (int j = i + 1; j < T; j++) pr[j] = 0.0f;
    dw[wi] = dsa_add(dw[wi], gw);
}

// n = rows·H.
extern "C" __global__ void dsa_index_bwd_f32(float* p, float* dw, const float* ds, const float* w, long long n, int b, int i0, int T, int H,
                                             int relu) {
    DSA_GRID_STRIDE(e, n) { dsa_index_bwd_row(p, dw, ds, w, e, b, i0, T, H, relu); }
}
