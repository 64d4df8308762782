package cpu

// Packing copies blocks of A and B into the layouts the micro-kernels read:
//
//	A panel (mr rows × kc): dst[p*mr + i] = op(A)[i0+i, p0+p]
//	B strip (kc × NR):      dst[p*NR + j] = op(B)[p0+p, j0+j], zero for j ≥ nr
//
// Both transposes of each operand are handled here, so the kernels see one
// layout. Where packing transposes (A stored m×k, B stored n×k) it uses the
// kernel set's 16×16 register transposes when it has them, else Go loops
// that move four source rows at a time.

// packA packs rows [i0, i0+mr) × columns [p0, p0+kc) of op(A) into
// dst[:mr*kc].
func packA(ks *kernSet, dst []float32, tA Transpose, a []float32, lda, i0, p0, mr, kc int) {
	if ks.bf16 != packFP32 {
		packABF16(ks, dst, tA, a, lda, i0, p0, mr, kc)
		return
	}
	dst = dst[:mr*kc]
	if tA {
		// op(A)[i, p] = a[p*lda + i]: each k step is mr contiguous floats.
		if ks.cpMR != nil && mr == ks.mr {
			_ = a[(p0+kc-1)*lda+i0+mr-1] // the block lies inside a
			ks.cpMR(&a[p0*lda+i0], lda*4, &dst[0], kc)
			return
		}
		for p := 0; p < kc; p++ {
			copy(dst[p*mr:][:mr], a[(p0+p)*lda+i0:][:mr])
		}
		return
	}
	// op(A)[i, p] = a[i*lda + p]: rows are contiguous, the panel is their transpose.
	p := 0
	switch {
	case ks.trMR != nil && mr == ks.mr:
		_ = a[(i0+mr-1)*lda+p0+kc-1] // the block lies inside a
		for ; p+16 <= kc; p += 16 {
			ks.trMR(&a[i0*lda+p0+p], lda*4, &dst[p*mr], mr*4)
		}
	case ks.tr16 != nil && mr < 16 && kc >= 16 && (i0+15)*lda+p0+kc <= len(a):
		// A shorter panel (near-equal panels: 32 rows are 11+11+10) whose
		// next rows exist: transpose 16 rows at a time through a scratch
		// block and keep the panel's mr (the Go loop took ~4% of a
		// 32-sequence decode step).
		var tmp [16 * 16]float32
		for ; p+16 <= kc; p += 16 {
			transpose16(&a[i0*lda+p0+p], lda*4, &tmp)
			for c := range 16 {
				copy(dst[(p+c)*mr:][:mr], tmp[c*16:][:mr])
			}
		}
	}
	if p < kc {
		transposeGo(dst[p*mr:], mr, a[i0*lda+p0+p:], lda, mr, kc-p)
	}
}

// packBPanel packs rows [p0, p0+kc) × columns [j0, j0+nc) of op(B) into
// consecutive kc×ks.nr strips of dst, the last zero-padded.
func packBPanel(ks *kernSet, dst []float32, tB Transpose, b []float32, ldb, p0, j0, kc, nc int) {
	if ks.bf16 != packFP32 {
		packBPanelBF16(ks, dst, tB, b, ldb, p0, j0, kc, nc)
		return
	}
	nr := ks.nr
	full := nc / nr * nr
	if !tB && full > 0 && ks.strips != nil {
		// Row by row as below, in one call instead of a copy per strip row.
		_ = b[(p0+kc-1)*ldb+j0+full-1] // the block lies inside b
		_ = dst[kc*full-1]
		ks.strips(&b[p0*ldb+j0], ldb*4, &dst[0], kc*nr*4, kc, full/nr)
	} else if !tB && full > 0 {
		// Walk B row by row so reads stream through memory; each row feeds
		// every strip.
		for p := 0; p < kc; p++ {
			row := b[(p0+p)*ldb+j0:][:full]
			for jr := 0; jr < full; jr += nr {
				copy(dst[jr*kc+p*nr:][:nr], row[jr:jr+nr])
			}
		}
	} else {
		for jr := 0; jr < full; jr += nr {
			packB(ks, dst[jr*kc:], tB, b, ldb, p0, j0+jr, kc, nr)
		}
	}
	if full < nc {
		packB(ks, dst[full*kc:], tB, b, ldb, p0, j0+full, kc, nc-full)
	}
}

// packB packs rows [p0, p0+kc) × columns [j0, j0+nr) of op(B) into
// dst[:kc*ks.nr], zero-padding columns nr..ks.nr-1.
func packB(ks *kernSet, dst []float32, tB Transpose, b []float32, ldb, p0, j0, kc, nr int) {
	nrFull := ks.nr
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
	if ks.tr16 != nil {
		_ = b[(j0+nr-1)*ldb+p0+kc-1] // the block lies inside b
		for ; j+16 <= nr; j += 16 {
			p := 0
			for ; p+16 <= kc; p += 16 {
				ks.tr16(&b[(j0+j)*ldb+p0+p], ldb*4, &dst[p*nrFull+j], nrFull*4)
			}
			if p < kc {
				transposeGo(dst[p*nrFull+j:], nrFull, b[(j0+j)*ldb+p0+p:], ldb, 16, kc-p)
			}
		}
	}
	if j < nr {
		transposeGo(dst[j:], nrFull, b[(j0+j)*ldb+p0:], ldb, nr-j, kc)
	}
	if nr < nrFull {
		for p := 0; p < kc; p++ {
			clear(dst[p*nrFull+nr : (p+1)*nrFull])
		}
	}
}

// transposeGo sets dst[p*ldd + r] = src[r*lds + p] for r < rows, p < cols.
func transposeGo(dst []float32, ldd int, src []float32, lds, rows, cols int) {
	if rows == 0 || cols == 0 {
		return
	}
	r := 0
	for ; r+4 <= rows; r += 4 {
		r0 := src[r*lds:][:cols]
		r1 := src[(r+1)*lds:][:cols]
		r2 := src[(r+2)*lds:][:cols]
		r3 := src[(r+3)*lds:][:cols]
		for p := range r0 {
			d := dst[p*ldd+r:][:4]
			d[0] = r0[p]
			d[1] = r1[p]
			d[2] = r2[p]
			d[3] = r3[p]
		}
	}
	for ; r < rows; r++ {
		for p, v := range src[r*lds:][:cols] {
			dst[p*ldd+r] = v
		}
	}
}
