package cpu

// Packing copies blocks of A and B into the layouts the micro-kernels read:
//
//	A panel (mr rows × kc): dst[p*mr + i] = alpha * op(A)[i0+i, p0+p]
//	B strip (kc × NR):      dst[p*NR + j] = op(B)[p0+p, j0+j], zero for j ≥ nr
//
// Both transposes of each operand are handled here, so the kernels see one
// layout. Transposing copies work four source rows at a time so that each
// destination write covers four neighbouring floats.

// packA packs rows [i0, i0+mr) × columns [p0, p0+kc) of op(A), scaled by
// alpha, into dst[:mr*kc].
func packA(dst []float32, tA Transpose, a []float32, lda, i0, p0, mr, kc int, alpha float32) {
	dst = dst[:mr*kc]
	if tA {
		// op(A)[i, p] = a[p*lda + i]: each k step is mr contiguous floats.
		for p := 0; p < kc; p++ {
			src := a[(p0+p)*lda+i0:][:mr]
			d := dst[p*mr:][:mr]
			for i, v := range src {
				d[i] = alpha * v
			}
		}
		return
	}
	// op(A)[i, p] = a[i*lda + p]: rows are contiguous, the panel is their transpose.
	i := 0
	for ; i+4 <= mr; i += 4 {
		r0 := a[(i0+i)*lda+p0:][:kc]
		r1 := a[(i0+i+1)*lda+p0:][:kc]
		r2 := a[(i0+i+2)*lda+p0:][:kc]
		r3 := a[(i0+i+3)*lda+p0:][:kc]
		for p := range r0 {
			d := dst[p*mr+i:][:4]
			d[0] = alpha * r0[p]
			d[1] = alpha * r1[p]
			d[2] = alpha * r2[p]
			d[3] = alpha * r3[p]
		}
	}
	for ; i < mr; i++ {
		r := a[(i0+i)*lda+p0:][:kc]
		for p, v := range r {
			dst[p*mr+i] = alpha * v
		}
	}
}

// packB packs rows [p0, p0+kc) × columns [j0, j0+nr) of op(B) into
// dst[:kc*nrFull], zero-padding columns nr..nrFull-1.
func packB(dst []float32, tB Transpose, b []float32, ldb, p0, j0, kc, nr, nrFull int) {
	dst = dst[:kc*nrFull]
	if !tB {
		// op(B)[p, j] = b[p*ldb + j]: each k step is nr contiguous floats.
		for p := 0; p < kc; p++ {
			d := dst[p*nrFull:][:nrFull]
			copy(d, b[(p0+p)*ldb+j0:][:nr])
			clear(d[nr:])
		}
		return
	}
	// op(B)[p, j] = b[j*ldb + p]: columns of op(B) are contiguous rows of b.
	j := 0
	for ; j+4 <= nr; j += 4 {
		r0 := b[(j0+j)*ldb+p0:][:kc]
		r1 := b[(j0+j+1)*ldb+p0:][:kc]
		r2 := b[(j0+j+2)*ldb+p0:][:kc]
		r3 := b[(j0+j+3)*ldb+p0:][:kc]
		for p := range r0 {
			d := dst[p*nrFull+j:][:4]
			d[0] = r0[p]
			d[1] = r1[p]
			d[2] = r2[p]
			d[3] = r3[p]
		}
	}
	for ; j < nr; j++ {
		r := b[(j0+j)*ldb+p0:][:kc]
		for p, v := range r {
			dst[p*nrFull+j] = v
		}
	}
	if nr < nrFull {
		for p := 0; p < kc; p++ {
			clear(dst[p*nrFull+nr : (p+1)*nrFull])
		}
	}
}
