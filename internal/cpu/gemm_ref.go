package cpu

// SgemmRef is the naive reference for Sgemm: a triple loop accumulating in
// float64, with the same argument contract (including beta == 0 ignoring C
// and alpha == 0 or k == 0 giving C = beta*C without reading A or B). Tests
// hold every fast path against it.
func SgemmRef(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(tA, tB, m, n, k, a, lda, b, ldb, c, ldc)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var sum float64
			if alpha != 0 {
				for p := 0; p < k; p++ {
					ai, bi := i*lda+p, p*ldb+j
					if tA {
						ai = p*lda + i
					}
					if tB {
						bi = j*ldb + p
					}
					sum += float64(a[ai]) * float64(b[bi])
				}
			}
			v := float32(float64(alpha) * sum)
			if beta != 0 {
				v += beta * c[i*ldc+j]
			}
			c[i*ldc+j] = v
		}
	}
}
