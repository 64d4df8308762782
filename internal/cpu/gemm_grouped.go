package cpu

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
)

// GemmGroup is one product of a grouped GEMM, C = alpha·op(A)·op(B) + beta·C
// with op(A) M×K and op(B) K×N, laid out as for Sgemm.
type GemmGroup struct {
	M, N, K int
	A       []float32
	Lda     int
	B       []float32
	Ldb     int
	C       []float32
	Ldc     int
}

// GroupedSgemm computes every group's product in one call (the grouped GEMM
// of Megatron's --moe-grouped-gemm: all local experts' variable-size token
// groups at once), in float32, or rounding both operands to bfloat16 when
// bf16 is set (SgemmBF16's arithmetic). The C matrices must not overlap.
//
// Each group is computed whole, by the Sgemm call a loop over the groups
// would make, so the result is the loop's bit for bit and does not depend
// on the thread count; only the scheduling differs. A group holding more
// than 1/(2·Threads()) of all the multiply-adds runs alone on all the
// threads (as in the loop), one after another; the rest are handed out,
// largest first, to Threads() goroutines that each compute whole groups on
// one thread. That packs every op(B) once, as the loop does (cutting a
// group's rows into blocks, as this function first did, packs the expert's
// weight again for every block: 30% of the kernel time at 128 rows per
// expert), and unlike the loop its threads never wait for each other
// inside a product. LPT scheduling bounds the idle tail by the largest
// such group, under half a thread's share.
func GroupedSgemm(bf16 bool, tA, tB Transpose, alpha, beta float32, groups []GemmGroup) {
	// multiply-adds in float64: a product of three dimensions of
	// unchecked groups may not fit an int
	fmas := func(g *GemmGroup) float64 { return float64(g.M) * float64(g.N) * float64(g.K) }
	var total float64
	for i := range groups {
		g := &groups[i]
		if g.M < 0 || g.N < 0 || g.K < 0 {
			panic(fmt.Sprintf("cpu: GroupedSgemm: group %d: negative dimension m=%d n=%d k=%d", i, g.M, g.N, g.K))
		}
		total += fmas(g)
	}
	threads := Threads()
	one := func(g *GemmGroup, threads int) {
		sgemmStrided(bf16, threads, tA, tB, g.M, g.N, g.K, alpha, g.A, g.Lda, 0, g.B, g.Ldb, 0, beta, g.C, g.Ldc, 0, 1)
	}
	var rest []int
	for i := range groups {
		g := &groups[i]
		switch {
		case g.M == 0 || g.N == 0:
			// nothing to write (the loop's Sgemm returns at once)
		case threads > 1 && 2*float64(threads)*fmas(g) > total:
			one(g, threads)
		default:
			rest = append(rest, i)
		}
	}
	if len(rest) == 0 {
		return
	}
	slices.SortStableFunc(rest, func(a, b int) int { return cmp.Compare(fmas(&groups[b]), fmas(&groups[a])) })
	var next atomic.Int64
	Parallel(min(threads, len(rest)), 1, func(int, int) {
		for {
			i := next.Add(1) - 1
			if i >= int64(len(rest)) {
				return
			}
			one(&groups[rest[i]], 1)
		}
	})
}
