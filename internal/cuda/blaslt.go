package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// cuBLASLt (libcublasLt, beside libcublas in every CUDA toolkit) runs the
// same column-major products as cublasGemmStridedBatchedEx, described by
// descriptors instead of arguments, with epilogues that fuse the bias add,
// GELU and the bias gradient into the product. Its declarations in
// cublasLt.h (CUDA 11.8; unchanged in 12 and 13):
//
//	cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
//	cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
//	size_t cublasLtGetVersion(void);
//	cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType);
//	cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes);
//	cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
//	cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld);
//	cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t sizeInBytes);
//	cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
//	cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
//	cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf, size_t sizeInBytes);
//	cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
//	cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
//	    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
//	    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
//	    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);
//	cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
//	    const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
//	    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
//	    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
//
// The enum values and the two structs below are cublasLt.h's; TestLtABI
// pins them, and compiles a C program against the installed header when
// there is one to check them there too.

// Epilogue is a cublasLtEpilogue_t: what cuBLASLt does to the product
// before it stores D. In the column-major convention of GemmParams, a bias
// has one element per row of D (M: the columns of a row-major result, so a
// Linear's out features) and a bias gradient of BGRADB one per column of D
// (N), summed over K.
type Epilogue uint32

const (
	EpilogueDefault     Epilogue = 1                   // CUBLASLT_EPILOGUE_DEFAULT: D = α·op(A)·op(B) + β·C
	EpilogueBias        Epilogue = 4                   // CUBLASLT_EPILOGUE_BIAS: + bias[row]
	EpilogueGELU        Epilogue = 32                  // CUBLASLT_EPILOGUE_GELU: tanh-approximated GELU of the sum
	EpilogueGELUAux     Epilogue = EpilogueGELU | 128  // CUBLASLT_EPILOGUE_GELU_AUX: also stores the GELU's input in Aux
	EpilogueGELUBias    Epilogue = EpilogueGELU | 4    // CUBLASLT_EPILOGUE_GELU_BIAS: GELU(sum + bias[row])
	EpilogueGELUAuxBias Epilogue = EpilogueGELUAux | 4 // CUBLASLT_EPILOGUE_GELU_AUX_BIAS: that, storing sum + bias in Aux
	EpilogueDGELU       Epilogue = 64 | 128            // CUBLASLT_EPILOGUE_DGELU: D = product · GELU'(Aux)
	EpilogueDGELUBGrad  Epilogue = EpilogueDGELU | 16  // CUBLASLT_EPILOGUE_DGELU_BGRAD: that, and Bias = Σ over the columns of D
	EpilogueBGradA      Epilogue = 256                 // CUBLASLT_EPILOGUE_BGRADA: Bias[i] = Σ_k op(A)[i, k] (M elements)
	EpilogueBGradB      Epilogue = 512                 // CUBLASLT_EPILOGUE_BGRADB: Bias[j] = Σ_k op(B)[k, j] (N elements)
)

var epilogueNames = map[Epilogue]string{
	EpilogueDefault: "DEFAULT", EpilogueBias: "BIAS", EpilogueGELU: "GELU", EpilogueGELUAux: "GELU_AUX",
	EpilogueGELUBias: "GELU_BIAS", EpilogueGELUAuxBias: "GELU_AUX_BIAS", EpilogueDGELU: "DGELU",
	EpilogueDGELUBGrad: "DGELU_BGRAD", EpilogueBGradA: "BGRADA", EpilogueBGradB: "BGRADB",
}

func (e Epilogue) String() string {
	if n, ok := epilogueNames[e]; ok {
		return n
	}
	return fmt.Sprintf("cublasLtEpilogue(%d)", uint32(e))
}

// readsBias: the epilogue adds Bias (M elements); writesBias: it stores a
// bias gradient there; usesAux: it writes (forward) or reads (backward)
// the GELU input matrix Aux.
func (e Epilogue) readsBias() bool {
	return e == EpilogueBias || e == EpilogueGELUBias || e == EpilogueGELUAuxBias
}
func (e Epilogue) writesBias() bool {
	return e == EpilogueBGradA || e == EpilogueBGradB || e == EpilogueDGELUBGrad
}
func (e Epilogue) usesAux() bool {
	return e == EpilogueGELUAux || e == EpilogueGELUAuxBias || e == EpilogueDGELU || e == EpilogueDGELUBGrad
}

// cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t and
// cublasLtMatmulPreferenceAttributes_t values gotron sets.
const (
	ltDescTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA, int32 cublasOperation_t
	ltDescTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	ltDescEpilogue     = 7  // CUBLASLT_MATMUL_DESC_EPILOGUE, uint32
	ltDescBiasPointer  = 8  // CUBLASLT_MATMUL_DESC_BIAS_POINTER, void*
	ltDescAuxPointer   = 11 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, void*
	ltDescAuxLD        = 12 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64
	ltDescAScale       = 17 // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, const void* (device float32)
	ltDescBScale       = 18 // CUBLASLT_MATMUL_DESC_B_SCALE_POINTER
	ltDescFastAccum    = 25 // CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8
	ltLayoutBatchCount = 5  // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32
	ltLayoutBatchOff   = 6  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64
	ltPrefMaxWorkspace = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64
	ltPrefAlignA       = 5  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32 (B, C, D: 6, 7, 8)
)

// ltAlgo is cublasLtMatmulAlgo_t: uint64_t data[8].
type ltAlgo struct{ data [8]uint64 }

// ltHeuristicResult is cublasLtMatmulHeuristicResult_t.
type ltHeuristicResult struct {
	algo          ltAlgo
	workspaceSize uint64 // size_t
	state         int32  // cublasStatus_t
	wavesCount    float32
	reserved      [4]int32
}

// ltAPI is libcublasLt's functions.
type ltAPI struct {
	path string

	create        func(h *uintptr) int32
	destroy       func(h uintptr) int32
	version       func() uint64
	descCreate    func(desc *uintptr, compute, scale int32) int32
	descSet       func(desc uintptr, attr int32, buf unsafe.Pointer, size uintptr) int32
	descDestroy   func(desc uintptr) int32
	layoutCreate  func(layout *uintptr, typ int32, rows, cols uint64, ld int64) int32
	layoutSet     func(layout uintptr, attr int32, buf unsafe.Pointer, size uintptr) int32
	layoutDestroy func(layout uintptr) int32
	prefCreate    func(pref *uintptr) int32
	prefSet       func(pref uintptr, attr int32, buf unsafe.Pointer, size uintptr) int32
	prefDestroy   func(pref uintptr) int32
	heuristic     func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	// cublasLtMatmul, called by address (16 arguments, on every product).
	matmul uintptr
}

var ltLib lazy[ltAPI]

// cublasLtSearch finds libcublasLt, newest major version first.
func cublasLtSearch() libSearch {
	return libSearch{
		what:   "cuBLASLt from the CUDA toolkit (beside cuBLAS); set CUDA_HOME to the toolkit",
		names:  []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"},
		loader: true,
		dirs:   toolkitDirs(),
	}
}

func loadLt() (*ltAPI, error) {
	return ltLib.get(func() (*ltAPI, error) {
		lib, path, err := cublasLtSearch().open()
		if err != nil {
			return nil, err
		}
		s := &symbols{lib: lib, path: path}
		l := &ltAPI{path: path}
		s.fn(&l.create, "cublasLtCreate")
		s.fn(&l.destroy, "cublasLtDestroy")
		s.fn(&l.version, "cublasLtGetVersion")
		s.fn(&l.descCreate, "cublasLtMatmulDescCreate")
		s.fn(&l.descSet, "cublasLtMatmulDescSetAttribute")
		s.fn(&l.descDestroy, "cublasLtMatmulDescDestroy")
		s.fn(&l.layoutCreate, "cublasLtMatrixLayoutCreate")
		s.fn(&l.layoutSet, "cublasLtMatrixLayoutSetAttribute")
		s.fn(&l.layoutDestroy, "cublasLtMatrixLayoutDestroy")
		s.fn(&l.prefCreate, "cublasLtMatmulPreferenceCreate")
		s.fn(&l.prefSet, "cublasLtMatmulPreferenceSetAttribute")
		s.fn(&l.prefDestroy, "cublasLtMatmulPreferenceDestroy")
		s.fn(&l.heuristic, "cublasLtMatmulAlgoGetHeuristic")
		l.matmul = s.addr("cublasLtMatmul")
		if err := s.err(); err != nil {
			return nil, err
		}
		return l, nil
	})
}

// LtParams is one cuBLASLt product: GemmParams' column-major
// D = Alpha·op(A)·op(B) + Beta·C, with D written over C (the same matrix,
// the same layout), and an epilogue.
type LtParams struct {
	GemmParams
	// Epilogue is what is done to the sum before it is stored (0 means
	// EpilogueDefault). Epilogues other than the default take Batch ≤ 1.
	Epilogue Epilogue
	// Bias is the bias the BIAS epilogues add (M elements), or where the
	// BGRAD epilogues store the bias gradient (BGRADB: N elements;
	// BGRADA and DGELU_BGRAD: M), in CType (cuBLASLt's default bias type:
	// D's).
	Bias Ptr
	// Aux is the GELU input matrix (M×N, CType, leading dimension AuxLD, a
	// multiple of 8 at least M): written by the GELU_AUX epilogues, read by
	// the DGELU ones.
	Aux   Ptr
	AuxLD int
	// AScale and BScale are the device addresses of one float32 each that
	// cuBLASLt multiplies A's and B's values by (A/B_SCALE_POINTER: an FP8
	// operand's scale inverse, as Transformer Engine passes it), required
	// with FP8 operands and refused otherwise.
	AScale, BScale Ptr
	// FastAccum (FP8 only) lets the FP8 kernels sum without promoting
	// partial sums to float32 at intervals (FAST_ACCUM): Transformer
	// Engine's forward product; its dgrad and wgrad keep the split
	// accumulator (FastAccum false).
	FastAccum bool
}

func (p LtParams) epilogue() Epilogue {
	if p.Epilogue == 0 {
		return EpilogueDefault
	}
	return p.Epilogue
}

// ltLayout is one cublasLtMatrixLayout_t: a matrix as stored (column-major).
type ltLayout struct {
	Type       DataType
	Rows, Cols uint64
	LD         int64
	Batch      int32 // set only when > 1
	Stride     int64
}

// ltPlan is everything a product's descriptors say, without the device
// addresses: the key of the Device's cache of descriptors and algorithms
// (the alignments are the addresses' powers of two, which the heuristic
// needs), and what TestLtPlan reads through a host emulation.
type ltPlan struct {
	Compute        ComputeType
	Scale          DataType // the type of Alpha and Beta: always F32
	TransA, TransB int32    // cublasOperation_t
	Epilogue       Epilogue
	A, B, C        ltLayout // D is C
	AuxLD          int64    // 0 without an Aux epilogue
	Align          [4]uint32
	// BiasAlign and AuxAlign are the bias's and Aux's alignments (0
	// without): the heuristic reads them from the addresses on the
	// descriptor, so an algorithm is chosen for them.
	BiasAlign, AuxAlign uint32
	// FastAccum is CUBLASLT_MATMUL_DESC_FAST_ACCUM, set only for FP8
	// operands (where A and B are scaled through AScale and BScale).
	FastAccum int8
}

// fp8 reports whether the plan's operands are FP8 (and so scaled).
func (pl ltPlan) fp8() bool { return pl.A.Type.fp8() }

// align is the largest power of two up to 256 dividing p: what the
// preference's MIN_ALIGNMENT attributes say (their default, 256, would
// rule out every algorithm for an operand at a smaller offset).
func align(p Ptr) uint32 {
	for a := uint32(256); a > 1; a /= 2 {
		if uint64(p)%uint64(a) == 0 {
			return a
		}
	}
	return 1
}

// plan checks p and returns its descriptors.
func (p LtParams) plan() (ltPlan, error) {
	if err := p.check(); err != nil {
		return ltPlan{}, err
	}
	e := p.epilogue()
	if _, ok := epilogueNames[e]; !ok {
		return ltPlan{}, fmt.Errorf("cuda: cuBLASLt: epilogue %v is not one gotron knows", e)
	}
	var bad []string
	if e != EpilogueDefault && p.Batch > 1 {
		bad = append(bad, fmt.Sprintf("epilogue %v with batch %d (epilogues take one matrix)", e, p.Batch))
	}
	if (e.readsBias() || e.writesBias()) && p.Bias == 0 {
		bad = append(bad, fmt.Sprintf("epilogue %v needs a Bias address", e))
	}
	if !e.readsBias() && !e.writesBias() && p.Bias != 0 {
		bad = append(bad, fmt.Sprintf("a Bias address with epilogue %v, which has no bias", e))
	}
	if e.usesAux() {
		if p.Aux == 0 {
			bad = append(bad, fmt.Sprintf("epilogue %v needs an Aux address", e))
		}
		if p.AuxLD < p.M || p.AuxLD%8 != 0 {
			bad = append(bad, fmt.Sprintf("AuxLD %d: want a multiple of 8 at least M = %d", p.AuxLD, p.M))
		}
	} else if p.Aux != 0 || p.AuxLD != 0 {
		bad = append(bad, fmt.Sprintf("Aux with epilogue %v, which has none", e))
	}
	bad = append(bad, p.fp8Rules()...)
	if len(bad) > 0 {
		return ltPlan{}, fmt.Errorf("cuda: cuBLASLt M=%d N=%d K=%d: %s", p.M, p.N, p.K, strings.Join(bad, "; "))
	}
	compute := p.Compute
	if compute == 0 {
		compute = Compute32F
	}
	op := func(t bool) int32 {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	batch := max(p.Batch, 1)
	layout := func(t DataType, rows, cols, ld int, stride int64) ltLayout {
		l := ltLayout{Type: t, Rows: uint64(rows), Cols: uint64(cols), LD: int64(ld)}
		if batch > 1 {
			l.Batch, l.Stride = int32(batch), stride
		}
		return l
	}
	pl := ltPlan{Compute: compute, Scale: F32, TransA: op(p.TransA), TransB: op(p.TransB), Epilogue: e}
	if p.AType.fp8() && p.FastAccum {
		pl.FastAccum = 1
	}
	if p.TransA {
		pl.A = layout(p.AType, p.K, p.M, p.LDA, p.StrideA)
	} else {
		pl.A = layout(p.AType, p.M, p.K, p.LDA, p.StrideA)
	}
	if p.TransB {
		pl.B = layout(p.BType, p.N, p.K, p.LDB, p.StrideB)
	} else {
		pl.B = layout(p.BType, p.K, p.N, p.LDB, p.StrideB)
	}
	pl.C = layout(p.CType, p.M, p.N, p.LDC, p.StrideC)
	if e.usesAux() {
		pl.AuxLD = int64(p.AuxLD)
	}
	pl.Align = [4]uint32{align(p.A), align(p.B), align(p.C), align(p.C)}
	if e.readsBias() || e.writesBias() {
		pl.BiasAlign = align(p.Bias)
	}
	if e.usesAux() {
		pl.AuxAlign = align(p.Aux)
	}
	return pl, nil
}

// fp8Rules returns what is wrong with p's FP8 settings, as cuBLASLt's FP8
// matmul takes them: both operands FP8 and not both E5M2; the "TN" form
// (A transposed, B not: both stored with K contiguous); K and the leading
// dimensions of A and B multiples of 16 (16-byte rows); D float32 or
// bfloat16; compute float32; the default epilogue; one matrix; both
// scale addresses. Without FP8 operands, no scale address nor FastAccum.
func (p LtParams) fp8Rules() []string {
	if !p.AType.fp8() && !p.BType.fp8() {
		var bad []string
		if p.AScale != 0 || p.BScale != 0 || p.FastAccum {
			bad = append(bad, fmt.Sprintf("AScale, BScale or FastAccum with %v·%v operands (FP8 only)", p.AType, p.BType))
		}
		if p.CType.fp8() {
			bad = append(bad, fmt.Sprintf("an FP8 output (%v) from %v·%v operands", p.CType, p.AType, p.BType))
		}
		return bad
	}
	var bad []string
	if !p.AType.fp8() || !p.BType.fp8() {
		bad = append(bad, fmt.Sprintf("%v·%v: FP8 products take two FP8 operands", p.AType, p.BType))
	} else if p.AType == F8E5M2 && p.BType == F8E5M2 {
		bad = append(bad, "e5m2·e5m2: cuBLASLt multiplies E5M2 by E4M3 only")
	}
	if !p.TransA || p.TransB {
		bad = append(bad, fmt.Sprintf("transA=%v transB=%v: FP8 products take A transposed and B not (cuBLASLt's TN form)", p.TransA, p.TransB))
	}
	if p.K%16 != 0 || p.LDA%16 != 0 || p.LDB%16 != 0 {
		bad = append(bad, fmt.Sprintf("K=%d LDA=%d LDB=%d: FP8 products want multiples of 16", p.K, p.LDA, p.LDB))
	}
	if p.CType != F32 && p.CType != BF16 {
		bad = append(bad, fmt.Sprintf("output %v: FP8 products here write f32 or bf16", p.CType))
	}
	if p.Compute != 0 && p.Compute != Compute32F {
		bad = append(bad, fmt.Sprintf("compute %d: FP8 products compute in CUBLAS_COMPUTE_32F", p.Compute))
	}
	if p.epilogue() != EpilogueDefault {
		bad = append(bad, fmt.Sprintf("epilogue %v with FP8 operands (default only here)", p.epilogue()))
	}
	if p.Batch > 1 {
		bad = append(bad, fmt.Sprintf("batch %d with FP8 operands (one matrix)", p.Batch))
	}
	if p.AScale == 0 || p.BScale == 0 {
		bad = append(bad, "FP8 operands need AScale and BScale addresses")
	}
	return bad
}

// ErrLtNoAlgorithm is what LtMatmul returns (wrapped) when cuBLASLt has no
// algorithm for a product (cublasLtMatmulAlgoGetHeuristic found none, or
// said CUBLAS_STATUS_NOT_SUPPORTED): the caller runs it another way
// (GemmStridedBatched and a separate epilogue).
var ErrLtNoAlgorithm = errors.New("cuBLASLt has no algorithm for this product")

// ltEntry is one plan's descriptors and algorithm.
type ltEntry struct {
	desc      uintptr
	a, b, c   uintptr // layouts; D's is c's
	algo      ltAlgo
	workspace uint64
	noAlgo    error // non-nil: the heuristic found none (cached too)
}

// ltHandle is the Device's cuBLASLt handle, its workspace and its cache.
type ltHandle struct {
	api            *ltAPI
	h              uintptr
	version        int
	workspace      Ptr
	workspaceBytes int64
	cache          map[ltPlan]*ltEntry
}

// ltLocked returns the Device's cuBLASLt handle, created at its first use
// (d.mu held, the context current): a process that never asks for
// cuBLASLt never loads it.
func (d *Device) ltLocked() (*ltHandle, error) {
	if d.lt != nil {
		return d.lt, nil
	}
	if d.ltErr != nil {
		return nil, d.ltErr
	}
	api, err := loadLt()
	if err != nil {
		d.ltErr = err
		return nil, err
	}
	l := &ltHandle{api: api, cache: map[ltPlan]*ltEntry{}, workspaceBytes: d.ltWorkspace}
	if err := blasCheck("cublasLtCreate", api.create(&l.h)); err != nil {
		d.ltErr = fmt.Errorf("%w (cuBLASLt %s)", err, api.path)
		return nil, d.ltErr
	}
	l.version = int(api.version())
	if l.workspaceBytes > 0 {
		ws, err := d.alloc.Alloc(l.workspaceBytes)
		if err != nil {
			api.destroy(l.h)
			return nil, fmt.Errorf("cuda: cuBLASLt workspace: %w", err)
		}
		l.workspace = ws
	}
	d.lt = l
	return l, nil
}

// destroy releases every cached descriptor and the handle (d.mu held).
func (l *ltHandle) destroy() error {
	var errs []error
	for _, e := range l.cache {
		errs = append(errs, l.freeEntry(e))
	}
	errs = append(errs, blasCheck("cublasLtDestroy", l.api.destroy(l.h)))
	return errors.Join(errs...)
}

func (l *ltHandle) freeEntry(e *ltEntry) error {
	var errs []error
	for _, ly := range []uintptr{e.a, e.b, e.c} {
		if ly != 0 {
			errs = append(errs, blasCheck("cublasLtMatrixLayoutDestroy", l.api.layoutDestroy(ly)))
		}
	}
	if e.desc != 0 {
		errs = append(errs, blasCheck("cublasLtMatmulDescDestroy", l.api.descDestroy(e.desc)))
	}
	return errors.Join(errs...)
}

// entry returns plan's descriptors and algorithm, made once (for p, the
// first product of the plan: its bias and Aux addresses are on the
// descriptor when the heuristic reads their alignment).
func (l *ltHandle) entry(pl ltPlan, p LtParams) (*ltEntry, error) {
	if e, ok := l.cache[pl]; ok {
		return e, nil
	}
	e := &ltEntry{}
	if err := l.build(pl, e, p); err != nil {
		l.freeEntry(e)
		return nil, err
	}
	l.cache[pl] = e
	return e, nil
}

func (l *ltHandle) build(pl ltPlan, e *ltEntry, p LtParams) error {
	if err := l.api.describe(pl, e); err != nil {
		return err
	}
	if err := l.api.setPointers(pl, e, p); err != nil {
		return err
	}
	return l.pickAlgo(pl, e)
}

// setPointers sets p's bias and Aux addresses (and FP8 scale addresses) on e's descriptor, as
// pl's epilogue reads them: at every call (they change from call to call;
// host memory, the stream's order is unaffected) and before the heuristic.
func (api *ltAPI) setPointers(pl ltPlan, e *ltEntry, p LtParams) error {
	if pl.Epilogue.readsBias() || pl.Epilogue.writesBias() {
		bias := uintptr(p.Bias)
		if err := blasCheck("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", api.descSet(e.desc, ltDescBiasPointer, unsafe.Pointer(&bias), unsafe.Sizeof(bias))); err != nil {
			return err
		}
	}
	if pl.Epilogue.usesAux() {
		aux := uintptr(p.Aux)
		if err := blasCheck("cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)", api.descSet(e.desc, ltDescAuxPointer, unsafe.Pointer(&aux), unsafe.Sizeof(aux))); err != nil {
			return err
		}
	}
	if pl.fp8() {
		as, bs := uintptr(p.AScale), uintptr(p.BScale)
		if err := errors.Join(
			blasCheck("cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)", api.descSet(e.desc, ltDescAScale, unsafe.Pointer(&as), unsafe.Sizeof(as))),
			blasCheck("cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)", api.descSet(e.desc, ltDescBScale, unsafe.Pointer(&bs), unsafe.Sizeof(bs))),
		); err != nil {
			return err
		}
	}
	return nil
}

// describe makes pl's matmul descriptor and layouts into e (host objects:
// no handle, no GPU needed; TestLtDescriptors reads them back).
func (api *ltAPI) describe(pl ltPlan, e *ltEntry) error {
	setDesc := func(name string, attr int32, p unsafe.Pointer, size uintptr) error {
		return blasCheck("cublasLtMatmulDescSetAttribute("+name+")", api.descSet(e.desc, attr, p, size))
	}
	if err := blasCheck("cublasLtMatmulDescCreate", api.descCreate(&e.desc, int32(pl.Compute), int32(pl.Scale))); err != nil {
		return err
	}
	transA, transB, epi := pl.TransA, pl.TransB, uint32(pl.Epilogue)
	if err := errors.Join(
		setDesc("TRANSA", ltDescTransA, unsafe.Pointer(&transA), unsafe.Sizeof(transA)),
		setDesc("TRANSB", ltDescTransB, unsafe.Pointer(&transB), unsafe.Sizeof(transB)),
		setDesc("EPILOGUE", ltDescEpilogue, unsafe.Pointer(&epi), unsafe.Sizeof(epi)),
	); err != nil {
		return err
	}
	if pl.Epilogue.usesAux() {
		ld := pl.AuxLD
		if err := setDesc("EPILOGUE_AUX_LD", ltDescAuxLD, unsafe.Pointer(&ld), unsafe.Sizeof(ld)); err != nil {
			return err
		}
	}
	if pl.fp8() {
		fa := pl.FastAccum
		if err := setDesc("FAST_ACCUM", ltDescFastAccum, unsafe.Pointer(&fa), unsafe.Sizeof(fa)); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		ly  *uintptr
		def ltLayout
	}{{&e.a, pl.A}, {&e.b, pl.B}, {&e.c, pl.C}} {
		if err := blasCheck("cublasLtMatrixLayoutCreate", api.layoutCreate(m.ly, int32(m.def.Type), m.def.Rows, m.def.Cols, m.def.LD)); err != nil {
			return err
		}
		if m.def.Batch > 1 {
			n, s := m.def.Batch, m.def.Stride
			if err := errors.Join(
				blasCheck("cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", api.layoutSet(*m.ly, ltLayoutBatchCount, unsafe.Pointer(&n), unsafe.Sizeof(n))),
				blasCheck("cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", api.layoutSet(*m.ly, ltLayoutBatchOff, unsafe.Pointer(&s), unsafe.Sizeof(s))),
			); err != nil {
				return err
			}
		}
	}
	return nil
}

// pickAlgo asks cuBLASLt's heuristic for e's algorithm, within the
// workspace and for pl's alignments.
func (l *ltHandle) pickAlgo(pl ltPlan, e *ltEntry) error {
	api := l.api
	var pref uintptr
	if err := blasCheck("cublasLtMatmulPreferenceCreate", api.prefCreate(&pref)); err != nil {
		return err
	}
	defer api.prefDestroy(pref)
	ws := uint64(l.workspaceBytes)
	if err := blasCheck("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", api.prefSet(pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), unsafe.Sizeof(ws))); err != nil {
		return err
	}
	for i, a := range pl.Align {
		if err := blasCheck("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", api.prefSet(pref, ltPrefAlignA+int32(i), unsafe.Pointer(&a), unsafe.Sizeof(a))); err != nil {
			return err
		}
	}
	var res ltHeuristicResult
	var n int32
	r := api.heuristic(l.h, e.desc, e.a, e.b, e.c, e.c, pref, 1, unsafe.Pointer(&res), &n)
	switch {
	case r == 15: // CUBLAS_STATUS_NOT_SUPPORTED
		e.noAlgo = fmt.Errorf("cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_NOT_SUPPORTED: %w", ErrLtNoAlgorithm)
	case r != 0:
		return blasCheck("cublasLtMatmulAlgoGetHeuristic", r)
	case n < 1 || res.state != 0:
		e.noAlgo = fmt.Errorf("cublasLtMatmulAlgoGetHeuristic: %d algorithms (state %d): %w", n, res.state, ErrLtNoAlgorithm)
	default:
		e.algo, e.workspace = res.algo, res.workspaceSize
	}
	return nil
}

// LtVersion is cuBLASLt's version number (cublasLtGetVersion) and library
// path, loading it if no product has yet.
func (d *Device) LtVersion() (int, string, error) {
	if err := d.enter(); err != nil {
		return 0, "", err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.ltLocked()
	if err != nil {
		return 0, "", err
	}
	return l.version, l.api.path, nil
}

// LtMatmul queues cublasLtMatmul on the stream: p's product and epilogue,
// with the algorithm cuBLASLt's heuristic picks for its shape, types,
// layouts and alignments (asked once per plan and kept, with the plan's
// descriptors, until Close). An error wrapping ErrLtNoAlgorithm means
// cuBLASLt has none for it, nothing was queued, and the caller runs the
// product another way.
func (d *Device) LtMatmul(p LtParams) error {
	pl, err := p.plan()
	if err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: cuBLASLt matmul: %v is closed", d)
	}
	l, err := d.ltLocked()
	if err != nil {
		return err
	}
	e, err := l.entry(pl, p)
	if err != nil {
		return fmt.Errorf("cuBLASLt M=%d N=%d K=%d %v·%v→%v epilogue %v: %w", p.M, p.N, p.K, p.AType, p.BType, p.CType, pl.Epilogue, err)
	}
	if e.noAlgo != nil {
		return fmt.Errorf("cuBLASLt M=%d N=%d K=%d %v·%v→%v compute %d epilogue %v: %w", p.M, p.N, p.K, p.AType, p.BType, p.CType, pl.Compute, pl.Epilogue, e.noAlgo)
	}
	if err := l.api.setPointers(pl, e, p); err != nil {
		return err
	}
	d.launch.alpha, d.launch.beta = p.Alpha, p.Beta
	r := call(l.api.matmul, l.h, e.desc,
		uintptr(unsafe.Pointer(&d.launch.alpha)), uintptr(p.A), e.a, uintptr(p.B), e.b,
		uintptr(unsafe.Pointer(&d.launch.beta)), uintptr(p.C), e.c, uintptr(p.C), e.c,
		uintptr(unsafe.Pointer(&e.algo)), uintptr(l.workspace), uintptr(e.workspace), d.stream)
	runtime.KeepAlive(e)
	if err := blasCheck("cublasLtMatmul", r); err != nil {
		return fmt.Errorf("cuBLASLt M=%d N=%d K=%d %v·%v→%v compute %d epilogue %v: %w", p.M, p.N, p.K, p.AType, p.BType, p.CType, pl.Compute, pl.Epilogue, err)
	}
	return nil
}

// LtCached is the number of plans whose descriptors and algorithm the
// Device keeps (0 before the first LtMatmul).
func (d *Device) LtCached() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lt == nil {
		return 0
	}
	return len(d.lt.cache)
}

// FP8Operand is an FP8 matrix on the device, row-major with its last
// dimension (the product's K) contiguous, and the address of the float32
// its values are multiplied by (its scale inverse).
type FP8Operand struct {
	Data     Ptr
	Type     DataType // F8E4M3 or F8E5M2
	ScaleInv Ptr
}

// FP8RowMajor is the product Y = α·(P·Qᵀ)·scaleInv(P)·scaleInv(Q) + β·Y in
// row-major terms — Y n×m (Type yType), P n×k, Q m×k, each row contiguous
// — as cuBLASLt's FP8 matmul takes it: the TN form, column-major
// D (m×n) = Aᵀ·B with A = Q (stored k×m), B = P (stored k×n). A Linear
// layer's fprop y = x·wᵀ is P = x, Q = w; its dgrad dx = g·w is P = g,
// Q = wᵀ (the transposed cast of w); its wgrad dw = gᵀ·x is P = gᵀ,
// Q = xᵀ (transposed casts), as Transformer Engine casts them.
func FP8RowMajor(n, m, k int, p, q FP8Operand, y Ptr, yType DataType, alpha, beta float32, fastAccum bool) LtParams {
	return LtParams{
		GemmParams: GemmParams{TransA: true, M: m, N: n, K: k, Alpha: alpha, Beta: beta,
			A: q.Data, LDA: k, B: p.Data, LDB: k, C: y, LDC: m, AType: q.Type, BType: p.Type, CType: yType, Compute: Compute32F},
		AScale: q.ScaleInv, BScale: p.ScaleInv, FastAccum: fastAccum,
	}
}
