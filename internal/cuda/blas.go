package cuda

import (
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// DataType is a cudaDataType_t: the element type of a GEMM operand.
type DataType int32

const (
	F32  DataType = 0  // CUDA_R_32F
	F16  DataType = 2  // CUDA_R_16F
	BF16 DataType = 14 // CUDA_R_16BF
	// FP8 operands, cuBLASLt only (LtMatmul; CUDA 11.8 and newer, a GPU of
	// compute capability 8.9 or newer to run).
	F8E4M3 DataType = 28 // CUDA_R_8F_E4M3
	F8E5M2 DataType = 29 // CUDA_R_8F_E5M2
)

// fp8 reports whether t is an FP8 type.
func (t DataType) fp8() bool { return t == F8E4M3 || t == F8E5M2 }

func (t DataType) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case F8E4M3:
		return "e4m3"
	case F8E5M2:
		return "e5m2"
	}
	return fmt.Sprintf("cudaDataType(%d)", int32(t))
}

// ComputeType is a cublasComputeType_t: the precision of a GEMM's products
// and sums. All accumulate in fp32 and take fp32 Alpha and Beta.
type ComputeType int32

const (
	Compute32F         ComputeType = 68 // CUBLAS_COMPUTE_32F: fp32 throughout (fp32 inputs stay fp32)
	Compute32FFast16BF ComputeType = 75 // CUBLAS_COMPUTE_32F_FAST_16BF: fp32 inputs rounded to bf16 for tensor cores
	Compute32FFastTF32 ComputeType = 77 // CUBLAS_COMPUTE_32F_FAST_TF32: fp32 inputs rounded to tf32 for tensor cores
	Compute32FFast16F  ComputeType = 74 // CUBLAS_COMPUTE_32F_FAST_16F: fp32 inputs rounded to fp16 for tensor cores
)

const (
	cublasOpN         = 0  // CUBLAS_OP_N
	cublasOpT         = 1  // CUBLAS_OP_T
	cublasGemmDefault = -1 // CUBLAS_GEMM_DEFAULT
)

// blasAPI is libcublas's functions.
type blasAPI struct {
	path string

	cublasCreate       func(h *uintptr) int32
	cublasDestroy      func(h uintptr) int32
	cublasSetStream    func(h uintptr, stream uintptr) int32
	cublasGetVersion   func(h uintptr, v *int32) int32
	cublasSetWorkspace func(h uintptr, ws uintptr, size uint64) int32 // nil before cuBLAS 11.4
	// cublasGemmStridedBatchedEx, called by address (23 arguments; no
	// reflection on a per-op path).
	cublasGemmSBEx uintptr
	// cublasGemmGroupedBatchedEx (20 arguments, blas_grouped.go): 0 when
	// the loaded cuBLAS predates 12.5.
	cublasGemmGroupedEx uintptr
}

var blasLib lazy[blasAPI]

func loadBLAS() (*blasAPI, error) {
	return blasLib.get(func() (*blasAPI, error) {
		lib, path, err := cublasSearch().open()
		if err != nil {
			return nil, err
		}
		s := &symbols{lib: lib, path: path}
		b := &blasAPI{path: path}
		s.fn(&b.cublasCreate, "cublasCreate_v2")
		s.fn(&b.cublasDestroy, "cublasDestroy_v2")
		s.fn(&b.cublasSetStream, "cublasSetStream_v2")
		s.fn(&b.cublasGetVersion, "cublasGetVersion_v2")
		b.cublasGemmSBEx = s.addr("cublasGemmStridedBatchedEx")
		b.cublasGemmGroupedEx = s.optional("cublasGemmGroupedBatchedEx")
		if s.optional("cublasSetWorkspace_v2") != 0 {
			s.fn(&b.cublasSetWorkspace, "cublasSetWorkspace_v2")
		}
		if err := s.err(); err != nil {
			return nil, err
		}
		return b, nil
	})
}

// cublasStatusNames are cublasStatus_t's names (cublas_api.h).
var cublasStatusNames = map[int32]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
	8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func blasCheck(op string, code int32) error {
	if code == 0 {
		return nil
	}
	return &Error{Op: op, Code: int(code), Name: cublasStatusNames[code]}
}

// blasHandle is a cuBLAS handle bound to a Device's stream.
type blasHandle struct {
	api       *blasAPI
	h         uintptr
	version   int
	workspace Ptr
}

// newBLAS creates the Device's cuBLAS handle on its stream, with a
// workspace from the caching allocator.
func (d *Device) newBLAS(workspace int64) (*blasHandle, error) {
	api, err := loadBLAS()
	if err != nil {
		return nil, err
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	b := &blasHandle{api: api}
	if err := blasCheck("cublasCreate_v2", api.cublasCreate(&b.h)); err != nil {
		return nil, fmt.Errorf("%w (cuBLAS %s)", err, api.path)
	}
	var v int32
	if api.cublasGetVersion(b.h, &v) == 0 {
		b.version = int(v)
	}
	if err := blasCheck("cublasSetStream_v2", api.cublasSetStream(b.h, d.stream)); err != nil {
		b.destroy()
		return nil, err
	}
	if api.cublasSetWorkspace != nil && workspace > 0 {
		ws, err := d.alloc.Alloc(workspace)
		if err != nil {
			b.destroy()
			return nil, fmt.Errorf("cuda: cuBLAS workspace: %w", err)
		}
		if err := blasCheck("cublasSetWorkspace_v2", api.cublasSetWorkspace(b.h, uintptr(ws), uint64(workspace))); err != nil {
			d.alloc.Free(ws)
			b.destroy()
			return nil, err
		}
		b.workspace = ws
	}
	return b, nil
}

func (b *blasHandle) destroy() error {
	return blasCheck("cublasDestroy_v2", b.api.cublasDestroy(b.h))
}

// BLASVersion is cuBLAS's version number (e.g. 130100) and library path.
func (d *Device) BLASVersion() (int, string) { return d.blas.version, d.blas.api.path }

// GemmParams describe C = Alpha·op(A)·op(B) + Beta·C for Batch matrices at
// the given strides (in elements), in cuBLAS's column-major convention: a
// matrix of R rows and leading dimension ld has element (i, j) at i + j·ld.
// op(A) is M×K, op(B) is K×N, C is M×N. With TransA, A is stored K×M (so
// LDA >= K), else M×K (LDA >= M); likewise B. A row-major product
// C[m×n] = A[m×k]·B[k×n] is the column-major C^T = B^T·A^T: pass B as A and
// A as B with M and N swapped.
type GemmParams struct {
	TransA, TransB bool
	M, N, K        int
	Alpha, Beta    float32
	A              Ptr
	LDA            int
	StrideA        int64
	B              Ptr
	LDB            int
	StrideB        int64
	C              Ptr
	LDC            int
	StrideC        int64
	Batch          int // 0 counts as 1
	AType, BType   DataType
	CType          DataType
	Compute        ComputeType // 0 means Compute32F
}

func (p GemmParams) check() error {
	var bad []string
	if p.M <= 0 || p.N <= 0 || p.K <= 0 {
		bad = append(bad, "M, N and K must be positive")
	}
	for _, v := range []int{p.M, p.N, p.K, p.LDA, p.LDB, p.LDC, p.Batch} {
		if v > math.MaxInt32 {
			bad = append(bad, fmt.Sprintf("%d exceeds cuBLAS's 32-bit sizes", v))
		}
	}
	rowsA, rowsB := p.M, p.K
	if p.TransA {
		rowsA = p.K
	}
	if p.TransB {
		rowsB = p.N
	}
	if p.LDA < max(rowsA, 1) {
		bad = append(bad, fmt.Sprintf("LDA %d < %d rows of A as stored", p.LDA, rowsA))
	}
	if p.LDB < max(rowsB, 1) {
		bad = append(bad, fmt.Sprintf("LDB %d < %d rows of B as stored", p.LDB, rowsB))
	}
	if p.LDC < max(p.M, 1) {
		bad = append(bad, fmt.Sprintf("LDC %d < M = %d", p.LDC, p.M))
	}
	if p.Batch < 0 {
		bad = append(bad, "Batch must not be negative")
	}
	if p.A == 0 || p.B == 0 || p.C == 0 {
		bad = append(bad, "A, B and C must be device addresses")
	}
	if len(bad) > 0 {
		return fmt.Errorf("cuda: GEMM M=%d N=%d K=%d transA=%v transB=%v lda=%d ldb=%d ldc=%d batch=%d: %s",
			p.M, p.N, p.K, p.TransA, p.TransB, p.LDA, p.LDB, p.LDC, p.Batch, strings.Join(bad, "; "))
	}
	return nil
}

// GemmStridedBatched queues cublasGemmStridedBatchedEx on the stream
// (algorithm CUBLAS_GEMM_DEFAULT).
func (d *Device) GemmStridedBatched(p GemmParams) error {
	if err := p.check(); err != nil {
		return err
	}
	if p.AType.fp8() || p.BType.fp8() || p.CType.fp8() {
		return fmt.Errorf("cuda: GEMM %v·%v→%v: FP8 operands need cuBLASLt (LtMatmul), not cublasGemmStridedBatchedEx", p.AType, p.BType, p.CType)
	}
	batch := max(p.Batch, 1)
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
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: GEMM: %v is closed", d)
	}
	// Alpha and Beta are read from host memory during the call: the
	// Device's pinned launch buffer holds them.
	d.launch.alpha, d.launch.beta = p.Alpha, p.Beta
	i32 := func(v int) uintptr { return uintptr(uint32(int32(v))) }
	r := call(d.blas.api.cublasGemmSBEx, d.blas.h, uintptr(op(p.TransA)), uintptr(op(p.TransB)), i32(p.M), i32(p.N), i32(p.K),
		uintptr(unsafe.Pointer(&d.launch.alpha)), uintptr(p.A), i32(int(p.AType)), i32(p.LDA), uintptr(p.StrideA),
		uintptr(p.B), i32(int(p.BType)), i32(p.LDB), uintptr(p.StrideB),
		uintptr(unsafe.Pointer(&d.launch.beta)), uintptr(p.C), i32(int(p.CType)), i32(p.LDC), uintptr(p.StrideC),
		i32(batch), i32(int(compute)), i32(cublasGemmDefault))
	if err := blasCheck("cublasGemmStridedBatchedEx", r); err != nil {
		return fmt.Errorf("GEMM M=%d N=%d K=%d batch=%d %v·%v→%v compute %d: %w", p.M, p.N, p.K, batch, p.AType, p.BType, p.CType, compute, err)
	}
	return nil
}
