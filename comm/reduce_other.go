//go:build !amd64

package comm

// addF32 sets d[i] += s[i] for i < len(d) (len(s) ≥ len(d)).
func addF32(d, s []float32) { addF32Ref(d, s) }

// sumToNT has no portable form: ReduceNTo's block loop does the work.
func sumToNT(dsts, srcs []Buffer, avg bool) bool { return false }
