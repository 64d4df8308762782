package cpu

import "fmt"

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

// groupedRows is the row block of one work item: enough rows for a GEMM
// micro-kernel to amortise packing B, few enough that an expert's rows are
// shared among threads when the groups are uneven.
const groupedRows = 64

// GroupedSgemm computes every group's product in one call (the grouped GEMM
// of Megatron's --moe-grouped-gemm: all local experts' variable-size token
// groups at once), in float32, or rounding both operands to bfloat16 when
// bf16 is set (SgemmBF16's arithmetic). The groups' rows are cut into blocks
// and the blocks of all groups are shared among Threads() goroutines, each
// block a single-threaded Sgemm, so a group of a few rows does not leave the
// other threads idle and a large one is split. The C matrices must not
// overlap. The blocks are fixed by the groups' shapes, not by the threads,
// so the result does not depend on the thread count.
func GroupedSgemm(bf16 bool, tA, tB Transpose, alpha, beta float32, groups []GemmGroup) {
	var items int
	for i, g := range groups {
		if g.M < 0 || g.N < 0 || g.K < 0 {
			panic(fmt.Sprintf("cpu: GroupedSgemm: group %d: negative dimension m=%d n=%d k=%d", i, g.M, g.N, g.K))
		}
		items += (g.M + groupedRows - 1) / groupedRows
	}
	if items == 0 {
		return
	}
	// item → (group, block) by a prefix walk; items are few (tokens/64).
	start := make([]int, len(groups)+1)
	for i, g := range groups {
		start[i+1] = start[i] + (g.M+groupedRows-1)/groupedRows
	}
	Parallel(items, 1, func(lo, hi int) {
		gi := 0
		for it := lo; it < hi; it++ {
			for start[gi+1] <= it {
				gi++
			}
			g := &groups[gi]
			r0 := (it - start[gi]) * groupedRows
			m := min(groupedRows, g.M-r0)
			a := g.A
			if tA == NoTrans {
				a = a[r0*g.Lda:]
			} else {
				a = a[r0:]
			}
			sgemmStrided(bf16, 1, tA, tB, m, g.N, g.K, alpha, a, g.Lda, 0, g.B, g.Ldb, 0, beta, g.C[r0*g.Ldc:], g.Ldc, 0, 1)
		}
	})
}
