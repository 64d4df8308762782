package cpu

import (
	"fmt"
	"unsafe"
)

//go:generate go run ./gen -out .

// Transpose says whether a GEMM operand is used as stored or transposed.
type Transpose bool

const (
	// NoTrans uses the operand as stored.
	NoTrans Transpose = false
	// Trans uses the operand's transpose.
	Trans Transpose = true
)

// kernFunc is a micro-kernel: C[0:mr, 0:nr] = alpha*A·B (+ beta*C when load != 0)
// for a packed kc×mr A panel and a kc×nr B panel with rows ldb bytes apart;
// C rows are ldc bytes apart. mr and nr are fixed per function.
type kernFunc func(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int)

// transFunc copies a fixed r×16 block (rows lds bytes apart) to its 16×r
// transpose (rows ldd bytes apart).
type transFunc func(src *float32, lds int, dst *float32, ldd int)

// dotFunc computes r dot products out[i] = Σ_p a[p]·b[i*ldb/4+p] (r fixed
// per function, ldb in bytes).
type dotFunc func(k int, a, b *float32, ldb int, out *float32)

// copyFunc copies n rows of a fixed width (rows lds bytes apart) to
// consecutive rows of dst.
type copyFunc func(src *float32, lds int, dst *float32, n int)

// stripFunc packs rows×(strips·nr) floats of a row-major matrix (rows lds
// bytes apart) into nr-column strips ldd bytes apart.
type stripFunc func(src *float32, lds int, dst *float32, ldd, rows, strips int)

// kernSet is one ISA's micro-kernels with their cache blocking.
type kernSet struct {
	mr, nr int        // full tile: rows, columns
	kerns  []kernFunc // kerns[r-1] computes an r×nr tile, r = 1..mr
	// Blocking (in floats): an mc×kc block of A is packed per goroutine
	// and stays in L2; a kc×nc panel of B is packed once, lives in L3, and
	// each kc×nr strip of it is reused by every mr-row panel of the block.
	mc, kc, nc int
	// Optional packing helpers (nil: plain Go loops): trMR transposes an
	// mr×16 block, tr16 a 16×16 block, cpMR copies mr-float rows, strips
	// packs row-major B into full nr-column strips.
	trMR, tr16 transFunc
	cpMR       copyFunc
	strips     stripFunc
	// dots[r-1] computes r dot products (nil: none): with B stored n×k
	// and at most maxDotRows rows, C is a set of dot products of
	// contiguous rows, cheaper than packing all of B for so few rows.
	dots []dotFunc
	// wide[r-1] is kerns[r-1] reading a bfloat16 B panel (PackedB).
	wide []wideKernFunc
	// pair and pairWide (nil: none) compute one row against two adjacent
	// B strips at once (PackedB, float32 and bfloat16): a one-row product
	// then has four independent accumulator chains instead of two.
	pair     kernFunc
	pairWide wideKernFunc
	// bf16 says how packing rounds op(A) and op(B) to bfloat16 (see
	// gemm_bf16.go); the zero value packs fp32 as is.
	bf16 bf16Pack
}

// Sgemm computes C = alpha*op(A)*op(B) + beta*C in float32. op(A) is m×k,
// op(B) is k×n and C is m×n, all row-major with leading dimensions lda, ldb
// and ldc: A is stored m×k (lda ≥ k) when tA is NoTrans and k×m (lda ≥ m)
// when Trans; likewise B is stored k×n (ldb ≥ n) or n×k (ldb ≥ k).
//
// beta == 0 overwrites C (NaNs in C are ignored); alpha == 0 or k == 0 sets
// C = beta*C without reading A or B. Work is split over Threads()
// goroutines when it is large enough. Sgemm is safe for concurrent use and
// allocates nothing in steady state. It panics, naming the argument, when
// a dimension is negative, a leading dimension too small or a slice too
// short: these are programming errors, and the assembly must never read
// outside the slices.
func Sgemm(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	SgemmStrided(tA, tB, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)
}

// SgemmStrided runs batch independent Sgemm calls: call i uses
// a[i*strideA:], b[i*strideB:] and c[i*strideC:]. The C matrices must not
// overlap (strideC ≥ (m-1)*ldc + n when batch > 1); A and B may be shared
// (stride 0). Small problems are spread over threads by batch item, large
// ones split each item.
func SgemmStrided(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	sgemmStrided(false, Threads(), tA, tB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
}

// sgemmStrided is SgemmStrided, or SgemmStridedBF16 when bf16 is set, over
// at most threads goroutines.
func sgemmStrided(bf16 bool, threads int, tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	if batch < 0 || strideA < 0 || strideB < 0 || strideC < 0 {
		panic(fmt.Sprintf("cpu: SgemmStrided: negative batch %d or stride (A %d, B %d, C %d)", batch, strideA, strideB, strideC))
	}
	if batch == 0 {
		return
	}
	last := batch - 1
	checkGemm(tA, tB, m, n, k, a[min(len(a), last*strideA):], lda, b[min(len(b), last*strideB):], ldb, c[min(len(c), last*strideC):], ldc)
	if m == 0 || n == 0 {
		return
	}
	if extent := (m-1)*ldc + n; batch > 1 && strideC < extent {
		panic(fmt.Sprintf("cpu: SgemmStrided: strideC=%d < %d, the extent of one %d×%d C with ldc %d: the C matrices would overlap", strideC, extent, m, n, ldc))
	}
	if k == 0 || alpha == 0 {
		for bi := 0; bi < batch; bi++ {
			scaleC(c[bi*strideC:], m, n, ldc, beta)
		}
		return
	}
	j := getJob()
	j.tA, j.tB, j.m, j.n, j.k = tA, tB, m, n, k
	j.alpha, j.beta = alpha, beta
	j.a, j.lda, j.strideA = a, lda, strideA
	j.b, j.ldb, j.strideB = b, ldb, strideB
	j.c, j.ldc, j.strideC = c, ldc, strideC
	j.batch = batch
	if bf16 {
		j.ks = bf16KernelsFor(ActiveISA())
	} else {
		j.ks = kernelsFor(ActiveISA())
	}
	j.plan(threads)
	runJob(j)
	putJob(j)
}

// checkGemm panics unless the arguments describe matrices inside the slices.
func checkGemm(tA, tB Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("cpu: Sgemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	ar, ac := m, k
	if tA {
		ar, ac = k, m
	}
	br, bc := k, n
	if tB {
		br, bc = n, k
	}
	checkMatrix("A", a, ar, ac, lda)
	checkMatrix("B", b, br, bc, ldb)
	checkMatrix("C", c, m, n, ldc)
}

func checkMatrix(name string, s []float32, rows, cols, ld int) {
	if ld < max(cols, 1) {
		panic(fmt.Sprintf("cpu: Sgemm: ld%s=%d, want ≥ %d (the stored row length)", name, ld, max(cols, 1)))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; len(s) < need {
		panic(fmt.Sprintf("cpu: Sgemm: len(%s)=%d, want ≥ %d for %d×%d with ld %d", name, len(s), need, rows, cols, ld))
	}
}

// scaleC sets C = beta*C (C = 0 when beta == 0, ignoring NaNs).
func scaleC(c []float32, m, n, ldc int, beta float32) {
	for i := 0; i < m; i++ {
		row := c[i*ldc:][:n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// gemmBlock computes rows [i0, i1) × columns [j0, j1) of batch item bi with
// workspace w alone, Goto/BLIS style: for each kc×nc panel of op(B)
// (packed, or read in place when few rows share it), for each mc×kc block
// of op(A), run blockKernel.
func (j *gemmJob) gemmBlock(w *gemmWork, bi, i0, i1, j0, j1 int) {
	ks := &j.ks
	b := j.b[bi*j.strideB:]
	// Read B in place when it is stored row-major and each strip is used
	// by at most one A panel: packing would cost as much as the GEMM.
	// (bf16 packing must round, so it never reads B in place.)
	direct := j.tB == NoTrans && i1-i0 <= ks.mr && ks.bf16 == packFP32
	kcMax := ks.kc
	if direct {
		// Short k blocks keep the rows of B being read few enough that the
		// next strip finds its lines already fetched (and in the TLB).
		kcMax = directKC
	}
	for jc := j0; jc < j1; jc += ks.nc {
		nc := min(ks.nc, j1-jc)
		for pc := 0; pc < j.k; pc += kcMax {
			kc := min(kcMax, j.k-pc)
			if !direct {
				packBPanel(ks, w.bpack, j.tB, b, j.ldb, pc, jc, kc, nc)
			}
			for ic := i0; ic < i1; ic += ks.mc {
				j.blockKernel(w, w.bpack, direct, bi, ic, min(ks.mc, i1-ic), jc, nc, pc, kc)
			}
		}
	}
}

// blockKernel packs the mc×kc block of op(A) at (ic, pc) into w.apack and
// multiplies it with the kc×nc panel of op(B) at (pc, jc) into C: every
// nr-wide strip of the panel (bpack, or B itself when direct) against
// every mr-high panel of the block.
func (j *gemmJob) blockKernel(w *gemmWork, bpack []float32, direct bool, bi, ic, mc, jc, nc, pc, kc int) {
	ks := &j.ks
	a, b, c := j.a[bi*j.strideA:], j.b[bi*j.strideB:], j.c[bi*j.strideC:]
	first := pc == 0
	for ir := 0; ir < mc; ir += ks.mr {
		packA(ks, w.apack[ir*kc:], j.tA, a, j.lda, ic+ir, pc, min(ks.mr, mc-ir), kc)
	}
	for jr := 0; jr < nc; jr += ks.nr {
		nr := min(ks.nr, nc-jr)
		var bp *float32
		ldbBytes := ks.nr * 4
		switch {
		case !direct:
			bp = &bpack[jr*kc]
		case nr == ks.nr:
			bp = &b[pc*j.ldb+jc+jr]
			ldbBytes = j.ldb * 4
		default:
			packB(ks, w.bpack, j.tB, b, j.ldb, pc, jc+jr, kc, nr)
			bp = &w.bpack[0]
		}
		for ir := 0; ir < mc; ir += ks.mr {
			mr := min(ks.mr, mc-ir)
			ap := &w.apack[ir*kc]
			ci := (ic+ir)*j.ldc + jc + jr
			if nr == ks.nr {
				beta, load := float32(1), 1
				if first {
					beta = j.beta
					if beta == 0 {
						load = 0
					}
				}
				ks.kerns[mr-1](kc, ap, bp, ldbBytes, &c[ci], j.ldc*4, j.alpha, beta, load)
				continue
			}
			// Edge strip: compute the full-width tile into w.tile, then
			// merge the nr valid columns.
			ks.kerns[mr-1](kc, ap, bp, ldbBytes, &w.tile[0], ks.nr*4, j.alpha, 0, 0)
			mergeTile(c[ci:], j.ldc, w.tile[:], ks.nr, mr, nr, j.beta, first)
		}
	}
}

// gemmShared is part p's share of a job in splitShared mode. The job is a
// sequence of steps, one per (item, kc×nc panel of op(B)); each step has
// the same number of mc-row blocks of op(A). The panels are packed into two
// buffers in turn, in chunks of strips. Every part takes tickets from one
// counter, in this order: the chunks of panel 0; then for each step s, its
// first few blocks, the chunks of panel s+1, its other blocks. So the next
// panel is packed, by whichever parts get there, while step s is still
// being computed, and nobody waits for it at the step's end.
//
// Dependencies, each on a smaller ticket (so the holder of the smallest
// unfinished ticket can always go on, and part 0 alone can do everything):
// a block waits until its panel's chunks are all packed; a block of a later
// k block (pc > 0) waits until the same rows' block of the previous step is
// done, since it adds into the same C; a chunk of panel q waits until step
// q-2, the buffer's previous user, is finished. Nothing is packed twice, and
// a worker that the OS starts late just finds fewer tickets left.
func (j *gemmJob) gemmShared(p int) {
	ks := &j.ks
	w := &j.work[p]
	blocks := uint64(ceilDiv(j.m, j.mcShared))
	nJC, nPC := ceilDiv(j.n, ks.nc), ceilDiv(j.k, ks.kc)
	steps := uint64(j.batch * nJC * nPC)
	chunks, early := uint64(j.packChunks), uint64(j.packAfter)
	// step returns item, column and k offsets and the k and column extents
	// of step s.
	step := func(s uint64) (bi, jc, pc, kc, nc int) {
		r := int(s) % (nJC * nPC)
		bi, jc, pc = int(s)/(nJC*nPC), r/nPC*ks.nc, r%nPC*ks.kc
		return bi, jc, pc, min(ks.kc, j.k-pc), min(ks.nc, j.n-jc)
	}
	// packed[q%2] counts the chunks packed into panel q's buffer so far;
	// panel q is complete at (q/2+1)·chunks (panel q+2's chunks wait for
	// step q, hence for panel q).
	complete := func(q uint64) bool { return j.packed[q%2].Load() >= (q/2+1)*chunks }
	pack := func(q, c uint64) {
		if q >= 2 {
			j.done.waitFor(q - 1) // steps ≤ q-2 (which used this buffer) are finished
		}
		bi, jc, pc, kc, nc := step(q)
		strips := uint64(ceilDiv(nc, ks.nr))
		s0, s1 := int(c*strips/chunks)*ks.nr, int((c+1)*strips/chunks)*ks.nr
		packBPanel(ks, j.bshared[q%2][s0*kc:], j.tB, j.b[bi*j.strideB:], j.ldb, pc, jc+s0, kc, min(nc, s1)-s0)
		j.packed[q%2].Add(1)
		j.ready.add(1) // wakes parts waiting for the panel
	}
	run := func(s, blk uint64) {
		if !complete(s) {
			j.ready.waitUntil(func() bool { return complete(s) })
		}
		bi, jc, pc, kc, nc := step(s)
		if pc > 0 {
			// Accumulating into C: the previous k block of these rows (block
			// blk of step s-1) must be written first. lastDone[blk] is one
			// more than the latest step that finished block blk; no later
			// step can finish it before step s-1 does (step s+1's panel is
			// packed only after step s-1 is finished).
			last := &j.lastDone[blk]
			j.done.waitUntil(func() bool { return last.Load() >= s })
		}
		ic := int(blk) * j.mcShared
		j.blockKernel(w, j.bshared[s%2], false, bi, ic, min(j.mcShared, j.m-ic), jc, nc, pc, kc)
		j.done.stepDone(s, int(blocks), &j.lastDone[blk])
	}
	period := blocks + chunks // tickets per step but the last
	total := chunks + steps*blocks + (steps-1)*chunks
	for {
		t, ok := j.nextBlock.take(total)
		if !ok {
			return
		}
		if t < chunks {
			pack(0, t)
			continue
		}
		t -= chunks
		s, r := t/period, t%period
		switch {
		case s == steps-1 || r < early:
			run(s, r)
		case r < early+chunks:
			pack(s+1, r-early)
		default:
			run(s, r-chunks)
		}
	}
}

// maxDotRows is the most rows of C computed by dot products (each row
// streams all of B once; the packed path streams it once in total).
const maxDotRows = 3

// dotRows computes columns [j0, j1) of every row of batch item bi by dot
// products of op(A) rows with rows of B (stored n×k), four at a time.
func (j *gemmJob) dotRows(w *gemmWork, bi, j0, j1 int) {
	a, b, c := j.a[bi*j.strideA:], j.b[bi*j.strideB:], j.c[bi*j.strideC:]
	k := j.k
	for i := 0; i < j.m; i++ {
		var arow []float32
		if j.tA {
			arow = w.apack[:k] // gather column i of the stored k×m A
			for p := range arow {
				arow[p] = a[p*j.lda+i]
			}
		} else {
			arow = a[i*j.lda:][:k]
		}
		crow := c[i*j.ldc:]
		for jj := j0; jj < j1; jj += 4 {
			r := min(4, j1-jj)
			_ = b[(jj+r-1)*j.ldb+k-1] // the rows lie inside b
			j.ks.dots[r-1](k, &arow[0], &b[jj*j.ldb], j.ldb*4, &w.tile[0])
			for x, v := range w.tile[:r] {
				v *= j.alpha
				if j.beta != 0 {
					v += j.beta * crow[jj+x]
				}
				crow[jj+x] = v
			}
		}
	}
}

// directKC is the k block used when B is read in place (m ≤ mr, e.g.
// decoding): measured best for M=1 K=768 N=3072 on Zen 4 among 4..512 (12:
// ~25 GFLOP/s on one core, 64: 13, 512: 12.5).
const directKC = 12

// mergeTile adds an mr×nr tile t (rows ldt apart) into C: C = t + beta*C on
// the first k block (C = t when beta == 0), C += t afterwards.
func mergeTile(c []float32, ldc int, t []float32, ldt, mr, nr int, beta float32, first bool) {
	for i := 0; i < mr; i++ {
		row := c[i*ldc:][:nr]
		src := t[i*ldt:][:nr]
		switch {
		case !first:
			for x, v := range src {
				row[x] += v
			}
		case beta == 0:
			copy(row, src)
		default:
			for x, v := range src {
				row[x] = v + beta*row[x]
			}
		}
	}
}

// alignedFloats returns a slice of n float32s starting on a 64-byte boundary.
func alignedFloats(n int) []float32 {
	s := make([]float32, n+16)
	off := int(uintptr(unsafe.Pointer(&s[0]))%64) / 4
	if off != 0 {
		off = 16 - off
	}
	return s[off : off+n : off+n]
}
