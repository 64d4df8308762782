package cuda

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"unsafe"
)

// The grouped GEMM: cublasGemmGroupedBatchedEx (cuBLAS 12.5 and later) runs
// products of different shapes in one call, which is what the experts of an
// MoE layer are (each expert's token count differs from step to step, so
// cublasGemmBatchedEx, whose products share one shape, would need every
// group padded to the largest). Its declaration in cublas_api.h (cuBLAS
// 12.5+):
//
//	cublasStatus_t CUBLASWINAPI cublasGemmGroupedBatchedEx(cublasHandle_t handle,
//	    const cublasOperation_t transa_array[],
//	    const cublasOperation_t transb_array[],
//	    const int m_array[],
//	    const int n_array[],
//	    const int k_array[],
//	    const void* alpha_array,
//	    const void* const Aarray[],
//	    cudaDataType_t Atype,
//	    const int lda_array[],
//	    const void* const Barray[],
//	    cudaDataType_t Btype,
//	    const int ldb_array[],
//	    const void* beta_array,
//	    void* const Carray[],
//	    cudaDataType_t Ctype,
//	    const int ldc_array[],
//	    int group_count,
//	    const int group_size[],
//	    cublasComputeType_t computeType);
//
// The per-group arrays (transa … ldc, alpha, beta, group_size; group_count
// long) are host memory, read during the call (pointer mode host); Aarray,
// Barray and Carray (one pointer per problem) are device memory, read by
// the kernels. Every gotron group is one problem (group_size 1): the
// experts' shapes differ. The call takes no algorithm argument. Supported
// (cuBLAS documentation): compute CUBLAS_COMPUTE_32F with A, B, C all
// CUDA_R_32F, all CUDA_R_16F or all CUDA_R_16BF; CUBLAS_COMPUTE_32F_PEDANTIC
// and _FAST_TF32 with CUDA_R_32F; not the _FAST_16BF/_FAST_16F compute
// types that round float32 operands (gotron's --bf16 products).

// groupedGemmArgs is the order of cublasGemmGroupedBatchedEx's parameters,
// as declared above; TestGroupedGemmArgsMatchPrototype parses the
// declaration and checks marshalGroupedGemm against it.
var groupedGemmArgs = []string{
	"handle", "transa_array", "transb_array", "m_array", "n_array", "k_array",
	"alpha_array", "Aarray", "Atype", "lda_array", "Barray", "Btype", "ldb_array",
	"beta_array", "Carray", "Ctype", "ldc_array", "group_count", "group_size", "computeType",
}

// GemmGroup is one product of GemmGrouped, in GemmParams' column-major
// convention (no strides, no batch: one matrix each).
type GemmGroup struct {
	TransA, TransB bool
	M, N, K        int
	Alpha, Beta    float32
	A              Ptr
	LDA            int
	B              Ptr
	LDB            int
	C              Ptr
	LDC            int
}

// HasGroupedGemm reports whether the loaded cuBLAS has
// cublasGemmGroupedBatchedEx (12.5 and later).
func (d *Device) HasGroupedGemm() bool { return d.blas.api.cublasGemmGroupedEx != 0 }

// GroupedGemmSupported reports whether cublasGemmGroupedBatchedEx takes
// operands of type t (A, B and C alike) with compute type c.
func GroupedGemmSupported(t DataType, c ComputeType) bool {
	switch c {
	case 0, Compute32F:
		return t == F32 || t == F16 || t == BF16
	case Compute32FFastTF32:
		return t == F32
	}
	return false
}

// groupedGemmCall is one call's host arrays: the per-group arguments, the
// three device-pointer arrays (uploaded before the call) and the argument
// list handed to purego.
type groupedGemmCall struct {
	transA, transB, m, n, k, lda, ldb, ldc, size []int32
	alpha, beta                                  []float32
	ptrs                                         []uint64 // A pointers, then B, then C
}

func newGroupedGemmCall(groups []GemmGroup) *groupedGemmCall {
	g := len(groups)
	c := &groupedGemmCall{
		transA: make([]int32, g), transB: make([]int32, g), m: make([]int32, g), n: make([]int32, g), k: make([]int32, g),
		lda: make([]int32, g), ldb: make([]int32, g), ldc: make([]int32, g), size: make([]int32, g),
		alpha: make([]float32, g), beta: make([]float32, g), ptrs: make([]uint64, 3*g),
	}
	op := func(t bool) int32 {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	for i, p := range groups {
		c.transA[i], c.transB[i] = op(p.TransA), op(p.TransB)
		c.m[i], c.n[i], c.k[i] = int32(p.M), int32(p.N), int32(p.K)
		c.lda[i], c.ldb[i], c.ldc[i] = int32(p.LDA), int32(p.LDB), int32(p.LDC)
		c.size[i] = 1
		c.alpha[i], c.beta[i] = p.Alpha, p.Beta
		c.ptrs[i], c.ptrs[g+i], c.ptrs[2*g+i] = uint64(p.A), uint64(p.B), uint64(p.C)
	}
	return c
}

// marshal returns the call's 20 arguments in the prototype's order, with
// the device-pointer arrays at ptrs (the uploaded c.ptrs). The host arrays
// must stay alive until the call returns.
func (c *groupedGemmCall) marshal(handle uintptr, ptrs Ptr, at, bt, ct DataType, compute ComputeType) []uintptr {
	g := len(c.size)
	i32 := func(v int32) uintptr { return uintptr(uint32(v)) }
	p32 := func(s []int32) uintptr { return uintptr(unsafe.Pointer(&s[0])) }
	pf := func(s []float32) uintptr { return uintptr(unsafe.Pointer(&s[0])) }
	dev := func(i int) uintptr { return uintptr(ptrs) + uintptr(8*i*g) }
	return []uintptr{
		handle, p32(c.transA), p32(c.transB), p32(c.m), p32(c.n), p32(c.k),
		pf(c.alpha), dev(0), i32(int32(at)), p32(c.lda), dev(1), i32(int32(bt)), p32(c.ldb),
		pf(c.beta), dev(2), i32(int32(ct)), p32(c.ldc), i32(int32(g)), p32(c.size), i32(int32(compute)),
	}
}

// checkGroups checks every group as GemmParams.check does (positive sizes,
// 32-bit sizes, leading dimensions, device addresses).
func checkGroups(groups []GemmGroup) error {
	if len(groups) == 0 {
		return fmt.Errorf("cuda: grouped GEMM of no groups")
	}
	if len(groups) > math.MaxInt32/3 {
		return fmt.Errorf("cuda: grouped GEMM of %d groups: too many for cuBLAS's 32-bit counts", len(groups))
	}
	var bad []string
	for i, g := range groups {
		p := GemmParams{TransA: g.TransA, TransB: g.TransB, M: g.M, N: g.N, K: g.K, A: g.A, LDA: g.LDA, B: g.B, LDB: g.LDB, C: g.C, LDC: g.LDC}
		if err := p.check(); err != nil {
			bad = append(bad, fmt.Sprintf("group %d: %v", i, err))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("cuda: grouped GEMM: %s", strings.Join(bad, "; "))
	}
	return nil
}

// GemmGrouped queues every group's product, C = Alpha·op(A)·op(B) +
// Beta·C, as one cublasGemmGroupedBatchedEx call on the stream, all
// operands of type t (A, B and C) with the given compute type (0 means
// Compute32F). The C matrices must not overlap. It uploads the three
// device-pointer arrays first, a copy that waits for the stream, and
// returns an error without calling cuBLAS when HasGroupedGemm is false or
// the types are not supported (GroupedGemmSupported): the caller then runs
// the products one by one.
func (d *Device) GemmGrouped(t DataType, compute ComputeType, groups []GemmGroup) error {
	if !d.HasGroupedGemm() {
		return fmt.Errorf("cuda: grouped GEMM: %s has no cublasGemmGroupedBatchedEx (cuBLAS 12.5 or later has)", d.blas.api.path)
	}
	if compute == 0 {
		compute = Compute32F
	}
	if !GroupedGemmSupported(t, compute) {
		return fmt.Errorf("cuda: grouped GEMM: cublasGemmGroupedBatchedEx does not take %v operands with compute type %d", t, compute)
	}
	if err := checkGroups(groups); err != nil {
		return err
	}
	c := newGroupedGemmCall(groups)
	n := int64(8 * len(c.ptrs))
	ptrs, err := d.alloc.Alloc(n)
	if err != nil {
		return fmt.Errorf("cuda: grouped GEMM's pointer arrays: %w", err)
	}
	// Freed once queued: the allocator reuses a block only for work queued
	// later on the same stream, after this GEMM has read it.
	defer d.alloc.Free(ptrs)
	if err := d.CopyHtoD(ptrs, unsafe.Pointer(&c.ptrs[0]), n); err != nil {
		return fmt.Errorf("cuda: grouped GEMM's pointer arrays: %w", err)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: grouped GEMM: %v is closed", d)
	}
	r := call(d.blas.api.cublasGemmGroupedEx, c.marshal(d.blas.h, ptrs, t, t, t, compute)...)
	runtime.KeepAlive(c) // cuBLAS reads the host arrays during the call
	if err := blasCheck("cublasGemmGroupedBatchedEx", r); err != nil {
		return fmt.Errorf("grouped GEMM of %d groups %v compute %d: %w", len(groups), t, compute, err)
	}
	return nil
}
