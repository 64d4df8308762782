package cpu

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Prepacked B: products that reuse one op(B) many times — a served model's
// weights, read by every decode step — pack it once into the strips the
// micro-kernels read, instead of on every call. A decode step of a few rows
// then streams each weight once from memory, in order, with no repacking
// (which costs more than the product itself when m is small and B is stored
// (out, in)). Stored as bfloat16, the weights take half the bytes, and a
// memory-bound decode step half the time: the "wide" kernels widen each B
// vector to float32 as they load it (a zero-extension and a shift, exact),
// so the arithmetic is the fp32 kernels' on the bf16 values.

// wideKernFunc is a kernFunc whose B panel holds bfloat16 values (ldb in
// bytes).
type wideKernFunc func(kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int)

// PackedType is the element type of a PackedB.
type PackedType int

const (
	// PackedFloat32 keeps B in float32: SgemmPacked then computes exactly
	// what Sgemm computes whenever Sgemm packs B (the same blocking and
	// micro-kernels, so the same bits).
	PackedFloat32 PackedType = iota
	// PackedBFloat16 rounds B to bfloat16 (to nearest even): half the
	// bytes; exact for a B whose values are bf16 already.
	PackedBFloat16
)

// String returns "float32" or "bfloat16".
func (t PackedType) String() string {
	if t == PackedBFloat16 {
		return "bfloat16"
	}
	return "float32"
}

// PackedB is a k×n op(B) packed for SgemmPacked. Block q of k (rows
// [q·kc, q·kc+kcq) of op(B), kc the kernel set's k block) starts at element
// q·kc·nPad and holds the ceil(n/nr) strips of kcq×nr, the last
// zero-padded. A PackedB is immutable and safe for concurrent use.
type PackedB struct {
	k, n  int
	typ   PackedType
	isa   ISA
	ks    kernSet
	f32   []float32 // PackedFloat32
	b16   []uint16  // PackedBFloat16
	nPad  int       // strips·nr
	bytes int64
}

// PackB packs op(B) (k×n; B stored k×n with ldb ≥ n when tB is NoTrans,
// n×k with ldb ≥ k when Trans) for the kernels of the active ISA, in typ.
// It panics, like Sgemm, on dimensions that do not fit b.
func PackB(tB Transpose, k, n int, b []float32, ldb int, typ PackedType) *PackedB {
	if k <= 0 || n <= 0 {
		panic(fmt.Sprintf("cpu: PackB: %d×%d: dimensions must be positive", k, n))
	}
	if tB {
		checkMatrix("B", b, n, k, ldb)
	} else {
		checkMatrix("B", b, k, n, ldb)
	}
	isa := ActiveISA()
	ks := kernelsFor(isa)
	nr := ks.nr
	pb := &PackedB{k: k, n: n, typ: typ, isa: isa, ks: ks, nPad: ceilDiv(n, nr) * nr}
	total := k * pb.nPad
	var panel []float32
	if typ == PackedFloat32 {
		pb.f32 = alignedFloats(total)
		pb.bytes = int64(total) * 4
	} else {
		pb.b16 = alignedUint16s(total)
		pb.bytes = int64(total) * 2
		panel = alignedFloats(min(ks.kc, k) * pb.nPad)
	}
	for pc := 0; pc < k; pc += ks.kc {
		kc := min(ks.kc, k-pc)
		if typ == PackedFloat32 {
			packBPanel(&ks, pb.f32[pc*pb.nPad:], tB, b, ldb, pc, 0, kc, n)
			continue
		}
		packBPanel(&ks, panel, tB, b, ldb, pc, 0, kc, n)
		dst := pb.b16[pc*pb.nPad:][:kc*pb.nPad]
		for i, v := range panel[:kc*pb.nPad] {
			dst[i] = uint16(bf16Bits(v))
		}
	}
	return pb
}

// K and N return op(B)'s dimensions.
func (pb *PackedB) K() int { return pb.k }

// N returns op(B)'s columns.
func (pb *PackedB) N() int { return pb.n }

// Type returns the element type B is stored in.
func (pb *PackedB) Type() PackedType { return pb.typ }

// Bytes returns the memory the packed B holds.
func (pb *PackedB) Bytes() int64 { return pb.bytes }

// packedWork is one goroutine's workspace: the packed A block and the
// edge tile.
type packedWork struct {
	apack []float32
	tile  []float32
}

var packedWorks sync.Pool

// SgemmPacked computes C = alpha·A·B + beta·C with A m×k stored row-major
// (lda ≥ k), B packed by PackB and C m×n (ldc ≥ n). beta == 0 overwrites C.
// Work is split over Threads() goroutines by columns when it is large
// enough; it allocates nothing in steady state.
func SgemmPacked(m int, alpha float32, a []float32, lda int, pb *PackedB, beta float32, c []float32, ldc int) {
	sgemmPacked(m, alpha, a, lda, pb, beta, c, ldc, nil)
}

// SgemmPackedBias computes C = A·B + bias (bias added to every row, after
// the product: fl(fl(A·B) + bias), what SgemmPacked then Add per row give,
// bit for bit) with A, B and C as SgemmPacked's. Each goroutine adds the
// bias to the columns it has just computed, while they are in cache: a
// linear layer's bias costs no pass of its own.
func SgemmPackedBias(m int, a []float32, lda int, pb *PackedB, bias, c []float32, ldc int) {
	if len(bias) < pb.n {
		panic(fmt.Sprintf("cpu: SgemmPackedBias: bias of %d for %d columns", len(bias), pb.n))
	}
	sgemmPacked(m, 1, a, lda, pb, 0, c, ldc, bias[:pb.n])
}

func sgemmPacked(m int, alpha float32, a []float32, lda int, pb *PackedB, beta float32, c []float32, ldc int, bias []float32) {
	if m < 0 {
		panic(fmt.Sprintf("cpu: SgemmPacked: negative m %d", m))
	}
	if m == 0 {
		return
	}
	checkMatrix("A", a, m, pb.k, lda)
	checkMatrix("C", c, m, pb.n, ldc)
	strips := pb.nPad / pb.ks.nr
	// At least ~256K flops per goroutine: fewer are not worth a wake-up.
	grain := max(1, (1<<18)/max(1, 2*m*pb.k*pb.ks.nr))
	j, _ := packedJobs.Get().(*packedJob)
	if j == nil {
		j = &packedJob{}
		j.run = j.strips // one method value per job, not one closure per call
	}
	j.pb, j.m, j.alpha, j.a, j.lda, j.beta, j.c, j.ldc, j.bias = pb, m, alpha, a, lda, beta, c, ldc, bias
	Parallel(strips, grain, j.run)
	*j = packedJob{run: j.run} // do not pin the operands
	packedJobs.Put(j)
}

// packedJob is one SgemmPacked call's arguments, shared by its goroutines.
type packedJob struct {
	pb          *PackedB
	m, lda, ldc int
	alpha, beta float32
	a, c        []float32
	bias        []float32 // nil: none
	run         func(s0, s1 int)
}

var packedJobs sync.Pool

// strips computes the columns of strips [s0, s1) with a pooled workspace.
func (j *packedJob) strips(s0, s1 int) {
	ks := &j.pb.ks
	w, _ := packedWorks.Get().(*packedWork)
	if w == nil || len(w.apack) < ks.mc*ks.kc || len(w.tile) < ks.mr*ks.nr {
		w = &packedWork{apack: alignedFloats(ks.mc * ks.kc), tile: alignedFloats(ks.mr * ks.nr)}
	}
	j.pb.gemmStrips(w, j.m, j.alpha, j.a, j.lda, j.beta, j.c, j.ldc, s0, s1)
	packedWorks.Put(w)
	if j.bias != nil {
		c0, c1 := s0*ks.nr, min(s1*ks.nr, j.pb.n)
		for i := range j.m {
			row := j.c[i*j.ldc+c0 : i*j.ldc+c1]
			Add(row, row, j.bias[c0:c1])
		}
	}
}

// gemmStrips computes the columns of strips [s0, s1) of C, Goto style as
// gemmBlock: the strips in groups of about nc columns (so a group's k block
// stays in cache while every mc-row block of A passes over it), k blocks
// in order, A packed per block. Per element of C the arithmetic is
// blockKernel's.
func (pb *PackedB) gemmStrips(w *packedWork, m int, alpha float32, a []float32, lda int, beta float32, c []float32, ldc int, s0, s1 int) {
	ks := &pb.ks
	nr := ks.nr
	group := max(1, ks.nc/nr)
	for g0 := s0; g0 < s1; g0 += group {
		g1 := min(s1, g0+group)
		for pc := 0; pc < pb.k; pc += ks.kc {
			kc := min(ks.kc, pb.k-pc)
			first := pc == 0
			for ic := 0; ic < m; ic += ks.mc {
				mc := min(ks.mc, m-ic)
				panels := ceilDiv(mc, ks.mr)
				for ir := 0; ir < mc; ir += panelRows(mc, panels, ir) {
					packA(ks, w.apack[ir*kc:], NoTrans, a, lda, ic+ir, pc, panelRows(mc, panels, ir), kc)
				}
				for s := g0; s < g1; s++ {
					off := pc*pb.nPad + s*kc*nr
					jc := s * nr
					cols := min(nr, pb.n-jc)
					if mc == 1 && s+1 < g1 && jc+2*nr <= pb.n && pb.pair(kc, &w.apack[0], off, &c[ic*ldc+jc], alpha, beta, first) {
						s++ // two strips done
						continue
					}
					for ir := 0; ir < mc; ir += panelRows(mc, panels, ir) {
						mr := panelRows(mc, panels, ir)
						ci := (ic+ir)*ldc + jc
						b, load := float32(1), 1
						if first {
							b = beta
							if beta == 0 {
								load = 0
							}
						}
						if cols == nr {
							pb.kern(mr, kc, &w.apack[ir*kc], off, &c[ci], ldc*4, alpha, b, load)
							continue
						}
						pb.kern(mr, kc, &w.apack[ir*kc], off, &w.tile[0], nr*4, alpha, 0, 0)
						mergeTile(c[ci:], ldc, w.tile, nr, mr, cols, beta, first)
					}
				}
			}
		}
	}
}

// panelRows is the height of the A panel starting at row ir of an mc-row
// block cut into panels of near-equal heights (at most the kernel's mr):
// 32 rows are 6+6+5+5+5+5 rather than 5×6+2, whose 2-row tail runs the
// kernel at a fraction of its speed (too few accumulators to hide the FMA
// latency). Each row of C is computed the same way whatever its panel's
// height, so this changes no bits.
func panelRows(mc, panels, ir int) int {
	base, tall := mc/panels, mc%panels // the first `tall` panels have base+1 rows
	if ir < tall*(base+1) {
		return base + 1
	}
	return base
}

// pair runs the one-row two-strip kernel on the strips at element off and
// the next, if the kernel set has one, and reports whether it did.
func (pb *PackedB) pair(kc int, a *float32, off int, c *float32, alpha, beta float32, first bool) bool {
	b, load := float32(1), 1
	if first {
		b = beta
		if beta == 0 {
			load = 0
		}
	}
	ks := &pb.ks
	switch {
	case pb.typ == PackedFloat32 && ks.pair != nil:
		ks.pair(kc, a, &pb.f32[off], ks.nr*4, c, 0, alpha, b, load)
	case pb.typ == PackedBFloat16 && ks.pairWide != nil:
		ks.pairWide(kc, a, &pb.b16[off], ks.nr*2, c, 0, alpha, b, load)
	default:
		return false
	}
	return true
}

// kern runs the mr-row kernel on the strip at element off.
func (pb *PackedB) kern(mr, kc int, a *float32, off int, c *float32, ldc int, alpha, beta float32, load int) {
	if pb.typ == PackedFloat32 {
		pb.ks.kerns[mr-1](kc, a, &pb.f32[off], pb.ks.nr*4, c, ldc, alpha, beta, load)
		return
	}
	pb.ks.wide[mr-1](kc, a, &pb.b16[off], pb.ks.nr*2, c, ldc, alpha, beta, load)
}

// alignedUint16s returns a slice of n uint16s starting on a 64-byte
// boundary.
func alignedUint16s(n int) []uint16 {
	f := alignedFloats((n + 1) / 2)
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(f))), n)
}

// kernWideGo is the pure-Go wide kernel: it widens the B panel into a
// float32 copy and runs kernGo on it.
func kernWideGo(mr, kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	var buf [256 * nrGeneric]float32 // genericKernels' kc × nr
	if kc > 256 {
		panic(fmt.Sprintf("cpu: wide Go kernel: k block %d > 256", kc))
	}
	ld := ldb / 2
	src := unsafe.Slice(b, (kc-1)*ld+nrGeneric)
	for p := 0; p < kc; p++ {
		for j, v := range src[p*ld:][:nrGeneric] {
			buf[p*nrGeneric+j] = math.Float32frombits(uint32(v) << 16)
		}
	}
	kernGo(mr, kc, a, &buf[0], nrGeneric*4, c, ldc, alpha, beta, load)
}

// kernsWideGeneric[mr-1] is the pure-Go wide kernel for mr rows.
var kernsWideGeneric = [mrGeneric]wideKernFunc{
	func(kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
		kernWideGo(1, kc, a, b, ldb, c, ldc, alpha, beta, load)
	},
	func(kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
		kernWideGo(2, kc, a, b, ldb, c, ldc, alpha, beta, load)
	},
	func(kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
		kernWideGo(3, kc, a, b, ldb, c, ldc, alpha, beta, load)
	},
	func(kc int, a *float32, b *uint16, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
		kernWideGo(4, kc, a, b, ldb, c, ldc, alpha, beta, load)
	},
}
