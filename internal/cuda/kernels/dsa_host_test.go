package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
)

// DeepSeek sparse attention's kernels (dsa.cu), run on the host by
// hostcheck in tensor/cuda_backend_dsa.go's order, with host loops for
// cuBLAS's products, against internal/cpu's DSA functions: the Hadamard
// rotation and the top-k selection bit for bit, the rest (whose products
// the CPU sums as float64 dots) within float32 rounding.

func intsIn(v []int32) string {
	var b strings.Builder
	for _, x := range v {
		fmt.Fprintf(&b, "%d\n", x)
	}
	return b.String()
}

// closeTo checks got against want within tol·max(1, |want|) per element.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsInf(w, 0) || math.IsNaN(w) {
			if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
				t.Fatalf("%s[%d]: the kernel's %v, the CPU's %v", what, i, g, w)
			}
			continue
		}
		if math.Abs(g-w) > tol*math.Max(1, math.Abs(w)) {
			t.Fatalf("%s[%d]: the kernel's %v, the CPU's %v", what, i, g, w)
		}
	}
}

// TestHostDSAHadamard: the rotation equals internal/cpu's bit for bit.
func TestHostDSAHadamard(t *testing.T) {
	for _, d := range []int{1, 2, 16, 64} {
		rng := rand.New(rand.NewPCG(uint64(d), 1))
		n := 5
		x := normals(rng, n*d, 1.5)
		want := make([]float32, n*d)
		cpu.HadamardTransform(want, x, n, d, 1/math.Sqrt(float64(d)))
		got := hexOut(t, runHostcheck(t, hexIn(x), "dsahad", n, d))
		compareParts(t, got, true, []string{"out"}, want)
	}
}

// TestHostDSATopK: the bitonic sort's selection equals internal/cpu's
// IndexerTopK exactly: causal rows (-Inf above the diagonal), ties (the
// earlier key first), K above a row's keys (-1), T not a power of two.
func TestHostDSATopK(t *testing.T) {
	for _, c := range []struct{ b, t, k int }{{2, 7, 3}, {1, 8, 8}, {3, 5, 6}, {1, 13, 4}} {
		rng := rand.New(rand.NewPCG(uint64(c.t), uint64(c.k)))
		rows := c.b * c.t
		scores := make([]float32, rows*c.t)
		for r := range rows {
			i := r % c.t
			for j := range c.t {
				if j > i {
					scores[r*c.t+j] = float32(math.Inf(-1))
					continue
				}
				scores[r*c.t+j] = float32(rng.IntN(4)) * 0.5 // many ties
				if rng.IntN(3) == 0 {
					scores[r*c.t+j] = float32(rng.NormFloat64())
				}
			}
		}
		want := make([]int32, rows*c.k)
		cpu.IndexerTopK(want, scores, c.b, c.t, c.k)
		lines := runHostcheck(t, hexIn(scores), "dsatopk", rows, c.t, c.k)
		if len(lines) != len(want) {
			t.Fatalf("hostcheck dsatopk printed %d lines, want %d", len(lines), len(want))
		}
		for i, l := range lines {
			if got, _ := strconv.Atoi(l); int32(got) != want[i] {
				t.Fatalf("b%d t%d K%d: idx[%d] (row %d) = %d, the CPU's %d", c.b, c.t, c.k, i, i/c.k, got, want[i])
			}
		}
	}
}

// TestHostDSAIndexer: the indexer's scores (chunks of queries' products
// combined over the heads, ReLU and not) and their backward (dq, dk, dw)
// against internal/cpu's float64 IndexerScores and IndexerScoresBackward.
func TestHostDSAIndexer(t *testing.T) {
	const B, T, H, D = 2, 7, 3, 8
	for _, relu := range []bool{true, false} {
		rng := rand.New(rand.NewPCG(7, 8))
		q, k, w := normals(rng, B*T*H*D, 1), normals(rng, B*T*D, 1), normals(rng, B*T*H, 0.5)
		ds := normals(rng, B*T*T, 0.1)
		scores := make([]float32, B*T*T)
		cpu.IndexerScores(scores, q, k, w, B, T, H, D, relu)
		dq, dk, dw := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(w))
		cpu.IndexerScoresBackward(dq, dk, dw, ds, q, k, w, B, T, H, D, relu)
		got := hexOut(t, runHostcheck(t, hexIn(q, k, w, ds), "dsaindex", B, T, H, D, map[bool]int{false: 0, true: 1}[relu]))
		off := 0
		for _, part := range []struct {
			name string
			want []float32
		}{{"scores", scores}, {"dq", dq}, {"dk", dk}, {"dw", dw}} {
			closeTo(t, fmt.Sprintf("relu %v: %s", relu, part.name), got[off:off+len(part.want)], part.want, 1e-5)
			off += len(part.want)
		}
	}
}

// dsaIdx draws each query's K selected causal keys (distinct, in a
// random order, -1 past the query's keys), as the indexer selects them.
func dsaIdx(rng *rand.Rand, b, tt, K int) []int32 {
	idx := make([]int32, b*tt*K)
	for r := range b * tt {
		i := r % tt
		perm := rng.Perm(i + 1)
		for c := range K {
			idx[r*K+c] = -1
			if c < len(perm) {
				idx[r*K+c] = int32(perm[c])
			}
		}
	}
	return idx
}

// TestHostDSASparseAttention: the attention over the selected keys —
// scores, the rows' softmax over the selected keys, the products with V,
// and the backward — against internal/cpu's SparseAttentionForward and
// SparseAttentionBackward, with chunks of two heads over three.
func TestHostDSASparseAttention(t *testing.T) {
	const B, T, N, dk, dv, K = 2, 6, 3, 5, 4, 3
	rng := rand.New(rand.NewPCG(9, 10))
	q, k := normals(rng, B*T*N*dk, 1), normals(rng, B*T*N*dk, 1)
	v, dout := normals(rng, B*T*N*dv, 1), normals(rng, B*T*N*dv, 1)
	idx := dsaIdx(rng, B, T, K)
	scale := float32(1 / math.Sqrt(dk))
	out, lse := make([]float32, len(v)), make([]float32, B*T*N)
	cpu.SparseAttentionForward(out, lse, q, k, v, idx, B, T, N, dk, dv, K, float64(scale))
	dq, dkk, dvv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	cpu.SparseAttentionBackward(dq, dkk, dvv, dout, q, k, v, out, lse, idx, B, T, N, dk, dv, K, float64(scale))
	got := hexOut(t, runHostcheck(t, hexIn(q, k, v, dout)+intsIn(idx), "dsaattn", B, T, N, dk, dv, K, fmt.Sprint(scale)))
	off := 0
	for _, part := range []struct {
		name string
		want []float32
	}{{"out", out}, {"lse", lse}, {"dq", dq}, {"dk", dkk}, {"dv", dvv}} {
		closeTo(t, part.name, got[off:off+len(part.want)], part.want, 1e-5)
		off += len(part.want)
	}
}

// TestHostDSAIndexerLoss: the loss's target (the heads' softmax summed,
// normalised), the scores' gradient and the loss against internal/cpu's
// IndexerTargetHeads and IndexerLoss, dense and sparse, averaged and per
// token.
func TestHostDSAIndexerLoss(t *testing.T) {
	const B, T, N, dk, K = 2, 6, 2, 4, 3
	for _, c := range []struct{ sparse, perToken bool }{{false, false}, {true, false}, {true, true}} {
		rng := rand.New(rand.NewPCG(11, 12))
		q, k := normals(rng, B*T*N*dk, 1), normals(rng, B*T*N*dk, 1)
		scores := normals(rng, B*T*T, 1)
		idx := dsaIdx(rng, B, T, K)
		scale := float32(0.5)
		target := make([]float32, B*T*T)
		cpu.IndexerTargetHeads(target, q, k, idx, B, T, N, dk, K, float64(scale), c.sparse)
		dlogits := make([]float32, B*T*T)
		loss := cpu.IndexerLoss(dlogits, target, scores, idx, B, T, K, c.sparse, c.perToken)
		b2i := map[bool]int{false: 0, true: 1}
		lines := runHostcheck(t, hexIn(q, k, scores)+intsIn(idx), "dsaloss", B, T, N, dk, K, fmt.Sprint(scale), b2i[c.sparse], b2i[c.perToken])
		if len(lines) != 2*B*T*T+1 {
			t.Fatalf("hostcheck dsaloss printed %d lines", len(lines))
		}
		got := hexOut(t, lines[:2*B*T*T])
		closeTo(t, fmt.Sprintf("%+v target", c), got[:B*T*T], target, 1e-5)
		closeTo(t, fmt.Sprintf("%+v dlogits", c), got[B*T*T:], dlogits, 1e-5)
		l, err := strconv.ParseFloat(lines[len(lines)-1], 64)
		if err != nil || math.Abs(l-loss) > 1e-5*math.Max(1, math.Abs(loss)) {
			t.Fatalf("%+v: loss %v (%v), the CPU's %v", c, l, err, loss)
		}
	}
}
