package cpu

import (
	"math"
	"unsafe"

	"github.com/gotron/gotron/internal/half"
)

// bf16 inputs: SgemmBF16 rounds op(A) and op(B) to bfloat16 (8-bit
// significand, fp32 range) while packing them, multiplies in fp32 (a
// product of two bf16 values is exact in fp32) and accumulates in fp32. On
// CPUs with AVX512_BF16 the packed panels hold bf16 pairs and the kernels
// use VDPBF16PS, which does two multiply-adds per fp32 lane per instruction;
// elsewhere the rounded values are packed as fp32 for the fp32 kernels.
// See docs/design/gemm.md, "bf16 inputs".

// bf16Pack says how a kernel set's packing treats op(A) and op(B).
type bf16Pack uint8

const (
	// packFP32 packs fp32 values unchanged (Sgemm).
	packFP32 bf16Pack = iota
	// packRounded packs values rounded to bf16, in the fp32 layout, for
	// the fp32 kernels (the portable SgemmBF16 path).
	packRounded
	// packPairs packs bf16 pairs (k, k+1) into 32-bit words for the
	// VDPBF16PS kernels: the A panel word q*mr+i holds op(A)[i, 2q] in
	// its low half and op(A)[i, 2q+1] in its high half, the B strip word
	// q*nr+j holds op(B)[2q, j] and op(B)[2q+1, j]; an odd k gets a zero
	// high half in its last pair. A panel or strip takes half the words of
	// its fp32 layout and starts where the fp32 one would.
	packPairs
)

// SgemmBF16 is Sgemm with bfloat16 inputs: it computes C = alpha*op(A)*op(B)
// + beta*C with every element of op(A) and op(B) first rounded to bfloat16
// (round to nearest even; NaN stays NaN, ±Inf stays ±Inf, values beyond
// the largest bf16 round to ±Inf), products and sums in float32. A, B and
// C are float32 slices; the arguments, panics, threading and the
// zero-allocation guarantee are those of Sgemm.
//
// With HasBF16GEMM (AVX512_BF16) the products use VDPBF16PS, which ignores
// MXCSR: bf16 inputs that are denormal (|x| < 2^-126) count as zero and
// denormal partial results are flushed to zero. Results whose terms are in
// the normal range agree with the portable path up to summation order.
func SgemmBF16(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmStrided(true, Threads(), tA, tB, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)
}

// SgemmStridedBF16 is SgemmStrided with bfloat16 inputs, as SgemmBF16.
func SgemmStridedBF16(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	sgemmStrided(true, Threads(), tA, tB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
}

// HasBF16GEMM reports whether SgemmBF16 uses the AVX512_BF16 kernels now:
// the CPU has AVX512_BF16 and the active ISA is avx512. When false,
// SgemmBF16 computes the same bf16-input numerics on the fp32 kernels, no
// faster than Sgemm.
func HasBF16GEMM() bool {
	_, ok := bf16PairKernels(ActiveISA())
	return ok
}

// bf16KernelsFor returns the kernel set SgemmBF16 uses on isa: the
// VDPBF16PS kernels when the CPU has them, else isa's fp32 kernels with
// rounding packers (and no dot-product path, which reads B unpacked).
func bf16KernelsFor(isa ISA) kernSet {
	if ks, ok := bf16PairKernels(isa); ok {
		return ks
	}
	ks := kernelsFor(isa)
	ks.bf16 = packRounded
	ks.dots = nil
	return ks
}

// RoundBF16 returns x rounded to the nearest bfloat16 (ties to even), as a
// float32: the value SgemmBF16 multiplies. NaN stays NaN (quiet).
func RoundBF16(x float32) float32 { return math.Float32frombits(bf16Bits(x) << 16) }

// bf16Bits returns the bfloat16 encoding of x rounded to nearest even
// (half.BFloat16From: a NaN keeps its sign and top payload bits and becomes
// quiet). The assembly packers (gen/bf16.go) compute the same bits.
func bf16Bits(x float32) uint32 { return uint32(half.BFloat16From(x)) }

// pairBits packs bf16(lo) into the low and bf16(hi) into the high half.
func pairBits(lo, hi float32) uint32 { return bf16Bits(lo) | bf16Bits(hi)<<16 }

// roundBF16Slice rounds every element of s to bf16 in place.
func roundBF16Slice(s []float32) {
	for i, v := range s {
		s[i] = RoundBF16(v)
	}
}

// words views a packing buffer as 32-bit words for bf16 pairs.
func words(s []float32) []uint32 {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&s[0])), len(s))
}

// packABF16 is packA for the bf16 kernel sets.
func packABF16(ks *kernSet, dst []float32, tA Transpose, a []float32, lda, i0, p0, mr, kc int) {
	if ks.bf16 == packRounded {
		fp := *ks
		fp.bf16 = packFP32
		packA(&fp, dst, tA, a, lda, i0, p0, mr, kc)
		roundBF16Slice(dst[:mr*kc])
		return
	}
	kp := (kc + 1) / 2
	d := words(dst[:kp*mr])
	if tA {
		// op(A)[i, p] = a[p*lda + i]: two k rows make mr pairs.
		for q := 0; q < kc/2; q++ {
			pairRows(a[(p0+2*q)*lda+i0:][:mr], a[(p0+2*q+1)*lda+i0:][:mr], d[q*mr:][:mr])
		}
		if kc%2 == 1 {
			r0 := a[(p0+kc-1)*lda+i0:][:mr]
			dq := d[(kp-1)*mr:][:mr]
			for i := range dq {
				dq[i] = bf16Bits(r0[i])
			}
		}
		return
	}
	// op(A)[i, p] = a[i*lda + p]: each row gives one word per pair step.
	for i := 0; i < mr; i++ {
		spreadPairs(d[i:], mr, a[(i0+i)*lda+p0:][:kc])
	}
}

// spreadPairs sets d[q*ld] = bf16(row[2q]) | bf16(row[2q+1])<<16 for the
// (len(row)+1)/2 pair steps of row, a zero high half for an odd length.
func spreadPairs(d []uint32, ld int, row []float32) {
	var tmp [256]uint32
	kc := len(row)
	for q0 := 0; q0 < kc/2; q0 += len(tmp) {
		t := tmp[:min(len(tmp), kc/2-q0)]
		pairsOf(row[2*q0:], t)
		for x, w := range t {
			d[(q0+x)*ld] = w
		}
	}
	if kc%2 == 1 {
		d[kc/2*ld] = bf16Bits(row[kc-1])
	}
}

// pairRowsGo is the Go statement of pairRows.
func pairRowsGo(r0, r1 []float32, d []uint32) {
	r0, r1 = r0[:len(d)], r1[:len(d)]
	for j := range d {
		d[j] = pairBits(r0[j], r1[j])
	}
}

// pairsOfGo is the Go statement of pairsOf.
func pairsOfGo(src []float32, d []uint32) {
	src = src[:2*len(d)]
	for q := range d {
		d[q] = pairBits(src[2*q], src[2*q+1])
	}
}

// packBPanelBF16 is packBPanel for the bf16 kernel sets: consecutive
// strips at dst[s*kc*ks.nr:], the last zero-padded to ks.nr columns.
func packBPanelBF16(ks *kernSet, dst []float32, tB Transpose, b []float32, ldb, p0, j0, kc, nc int) {
	nr := ks.nr
	strips := (nc + nr - 1) / nr
	if ks.bf16 == packRounded {
		fp := *ks
		fp.bf16 = packFP32
		packBPanel(&fp, dst, tB, b, ldb, p0, j0, kc, nc)
		roundBF16Slice(dst[:strips*kc*nr])
		return
	}
	kp := (kc + 1) / 2
	d := words(dst[:strips*kc*nr])
	if pad := strips*nr - nc; pad > 0 {
		s := d[(strips-1)*kc*nr:]
		for q := 0; q < kp; q++ {
			clear(s[q*nr+nr-pad : (q+1)*nr])
		}
	}
	if tB {
		// op(B)[p, j] = b[j*ldb + p]: each stored row is one column.
		for j := 0; j < nc; j++ {
			spreadPairs(d[j/nr*kc*nr+j%nr:], nr, b[(j0+j)*ldb+p0:][:kc])
		}
		return
	}
	// op(B)[p, j] = b[p*ldb + j]: walk two rows at a time, feeding every strip.
	for q := 0; q < kp; q++ {
		r0 := b[(p0+2*q)*ldb+j0:][:nc]
		var r1 []float32
		if 2*q+1 < kc {
			r1 = b[(p0+2*q+1)*ldb+j0:][:nc]
		}
		for jr := 0; jr < nc; jr += nr {
			n := min(nr, nc-jr)
			s := d[jr*kc+q*nr:][:n]
			x0 := r0[jr : jr+n]
			if r1 == nil {
				for j, v := range x0 {
					s[j] = bf16Bits(v)
				}
				continue
			}
			pairRows(x0, r1[jr:jr+n], s)
		}
	}
}
