package tensor

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/internal/cuda/kernels"
)

// The CUDA device: an NVIDIA GPU driven through internal/cuda (the driver
// API, cuBLAS and the kernels of internal/cuda/kernels, loaded at run time,
// so a CGO_ENABLED=0 binary runs on machines without one). A process opens
// one GPU (OpenCUDA), as a Megatron rank binds one with
// torch.cuda.set_device(local_rank); its tensors' storage is device memory
// from a caching allocator (devBuf), returned when the tape that handed it
// out resets or, for other tensors, when the garbage collector finds them
// unreachable.

// CUDAOptions configures OpenCUDA.
type CUDAOptions struct {
	// MemoryFraction caps the device memory the caching allocator reserves,
	// as a fraction of the GPU's total (0: internal/cuda's default).
	MemoryFraction float64
}

// cudaRuntime is the process's open GPU: the device, its kernels, and the
// device copies of host constants (RoPE tables).
type cudaRuntime struct {
	dev     *cuda.Device
	ordinal int
	modules []*cuda.Module
	fns     sync.Map // kernel name → *cuda.Function

	constMu sync.Mutex
	consts  map[any]*Tensor

	// prof, when GOTRON_CUDA_PROFILE is set at OpenCUDA, times every
	// kernel, GEMM and host copy (CUDAProfile).
	prof *cudaProfile

	// copies counts the host copies (CUDATransfers): each one waits for
	// the stream (staged ones excepted), so inside a training step each is
	// a stall.
	copies copyCounter

	// stagedCopies sends host-to-device copies of up to
	// cuda.StagingSlotBytes through internal/cuda's staging ring, which
	// does not wait for the stream: GOTRON_CUDA_UNVERIFIED (1, or a list naming staged-copies) at OpenCUDA
	// (built, not yet run on a GPU).
	stagedCopies bool

	// groupedGemms counts the grouped GEMM calls (CUDAGroupedGemms).
	groupedGemms atomic.Int64

	// fewerSyncs keeps a training step's scalars on the device until the
	// one read-back that needs them: LossMaskScale reads Σ mask there, and
	// ReadBack packs several tensors into one device-to-host copy.
	// GOTRON_CUDA_UNVERIFIED naming fewer-syncs at OpenCUDA (built, not yet
	// run on a GPU); without it each is its own synchronizing copy.
	fewerSyncs bool
}

// CUDAUnverified reports whether GOTRON_CUDA_UNVERIFIED (read through
// getenv) turns on feature, one of the CUDA features built but not yet run
// on a GPU: "cp" (context parallelism's block attention), "attn-bf16"
// (bf16/fp16 products in the materialized attention), "flash-tc" (the
// tensor-core flash attention under --bf16), "staged-copies"
// (host-to-device copies that do not wait for the stream), "fewer-syncs"
// (a step's scalars read back together, once), "moe-grouped" (the MoE
// experts' products as one cuBLAS grouped GEMM each), "fusion" (the fused
// bias-activation, bias-dropout-add and residual add + norm kernels),
// "gemm-bf16" (bfloat16 GEMM operands under --bf16: weights' bfloat16
// copies, activations cast once, cuBLAS on CUDA_R_16BF operands),
// "moe-router" (the MoE router's kernels), "cublaslt" (products through
// cuBLASLt, Linear's bias and bias gradient in its epilogues: cuda_lt.go),
// "sqrelu" (the squared ReLU's kernels), "output-gate" (the attention
// output gate's) and "mla" (multi-latent attention; here the attention by
// chunks of heads, attention_heads.go): gpt.Config.CheckDevice reads
// those three; "gdn" (the gated delta net's kernels, so far its causal
// convolution) only the op tests read, as the model is still refused.
// The variable is "1" or "all"
// for every one, or a comma-separated list of names.
func CUDAUnverified(getenv func(string) string, feature string) bool {
	v := getenv("GOTRON_CUDA_UNVERIFIED")
	if v == "1" || v == "all" {
		return true
	}
	for _, f := range strings.Split(v, ",") {
		if strings.TrimSpace(f) == feature {
			return true
		}
	}
	return false
}

// CUDATransfers returns the number and bytes of host copies to and from the
// open GPU so far (zero when none is open): every one, the backend's own
// (optimizer coefficients, list tables, read-back scalars) included, each
// of which synchronizes the stream (internal/cuda's CopyHtoD and CopyDtoH),
// by site (Transfers.Sites).
func CUDATransfers() Transfers {
	rt := cudaOpen.rt.Load()
	if rt == nil {
		return Transfers{}
	}
	return rt.copies.snapshot()
}

// copyName is the profile's name of a host copy: what, and under
// GOTRON_CUDA_PROFILE the site that asked for it (copySite's function, or
// the backend's name for its own copies), so the profile says where a
// step's copies come from.
func (rt *cudaRuntime) copyName(what, site string) string {
	if rt.prof == nil {
		return what
	}
	return what + " from " + site
}

// cudaProfile accumulates the wall time of each kernel from its launch to
// the end of a stream synchronization right after it: with the launch cost
// included, what a step spends where. Profiling serializes the host with
// the GPU, so steps run slower; the shares are what it is for.
type cudaProfile struct {
	mu     sync.Mutex
	byName map[string]*cudaProfEntry
}

type cudaProfEntry struct {
	calls int
	total time.Duration
}

// timed runs f, then waits for the stream, and adds the time to name.
func (rt *cudaRuntime) timed(name string, f func()) {
	if rt.prof == nil {
		f()
		return
	}
	start := time.Now()
	f()
	if err := rt.dev.Synchronize(); err != nil {
		panic(fmt.Sprintf("tensor: CUDA after %s: %v", name, err))
	}
	d := time.Since(start)
	rt.prof.mu.Lock()
	e := rt.prof.byName[name]
	if e == nil {
		e = &cudaProfEntry{}
		rt.prof.byName[name] = e
	}
	e.calls++
	e.total += d
	rt.prof.mu.Unlock()
}

// CUDAProfile returns the profile GOTRON_CUDA_PROFILE=1 collects — time
// per kernel, GEMM and copy, the largest first — and the allocator's
// statistics; "" when no GPU is open or profiling is off.
func CUDAProfile() string {
	rt := cudaOpen.rt.Load()
	if rt == nil || rt.prof == nil {
		return ""
	}
	rt.prof.mu.Lock()
	defer rt.prof.mu.Unlock()
	type row struct {
		name string
		e    cudaProfEntry
	}
	var rows []row
	var sum time.Duration
	for n, e := range rt.prof.byName {
		rows = append(rows, row{n, *e})
		sum += e.total
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].e.total > rows[j].e.total })
	var b strings.Builder
	fmt.Fprintf(&b, "CUDA profile (each call synchronized): %.1f ms in %d names\n", sum.Seconds()*1e3, len(rows))
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-40s %8d calls %10.2f ms %9.1f us/call %5.1f%%\n", r.name, r.e.calls,
			r.e.total.Seconds()*1e3, r.e.total.Seconds()*1e6/float64(r.e.calls), 100*r.e.total.Seconds()/sum.Seconds())
	}
	st := rt.dev.MemStats()
	fmt.Fprintf(&b, "  allocator: in use %.2f GiB, peak %.2f GiB, reserved %.2f GiB, %d allocs (%d cache hits, %d from the driver)\n",
		float64(st.InUse)/(1<<30), float64(st.Peak)/(1<<30), float64(st.Reserved)/(1<<30), st.Allocs, st.CacheHits, st.RawAllocs)
	return b.String()
}

// cudaOpen is the process's CUDA device, once opened.
var cudaOpen struct {
	mu sync.Mutex
	rt atomic.Pointer[cudaRuntime]
}

// OpenCUDA opens GPU ordinal as this process's CUDA device and loads the
// kernels; tensors on CUDA live there. Opening the same ordinal again is a
// no-op; another ordinal is an error (one GPU per process).
func OpenCUDA(ordinal int, opts CUDAOptions) error {
	cudaOpen.mu.Lock()
	defer cudaOpen.mu.Unlock()
	if rt := cudaOpen.rt.Load(); rt != nil {
		if rt.ordinal != ordinal {
			return fmt.Errorf("tensor: CUDA device %d is open in this process; cannot also open %d (one GPU per process: start one process per GPU)", rt.ordinal, ordinal)
		}
		return nil
	}
	rt := &cudaRuntime{ordinal: ordinal, consts: map[any]*Tensor{}}
	// features built but not yet run on a GPU (docs/design/cuda.md)
	if CUDAUnverified(os.Getenv, "attn-bf16") {
		SetCUDAAttentionReducedPrecision(true)
	}
	if CUDAUnverified(os.Getenv, "flash-tc") {
		SetCUDAAttentionTensorCores(true)
	}
	rt.stagedCopies = CUDAUnverified(os.Getenv, "staged-copies")
	if CUDAUnverified(os.Getenv, "moe-grouped") {
		SetCUDAGroupedGemm(true)
	}
	rt.fewerSyncs = CUDAUnverified(os.Getenv, "fewer-syncs")
	if CUDAUnverified(os.Getenv, "fusion") {
		SetCUDAFusedKernels(true)
	}
	if CUDAUnverified(os.Getenv, "moe-router") {
		SetCUDARouter(true)
	}
	if CUDAUnverified(os.Getenv, "gemm-bf16") {
		SetCUDABF16GemmOperands(true)
	}
	if os.Getenv("GOTRON_CUDA_PROFILE") != "" {
		rt.prof = &cudaProfile{byName: map[string]*cudaProfEntry{}}
	}
	dev, err := cuda.Open(ordinal, cuda.Options{MemoryFraction: opts.MemoryFraction, OnPressure: collectDeviceGarbage})
	if err != nil {
		return err
	}
	major, minor := dev.ComputeCapability()
	ptx, err := kernels.PTX(major, minor)
	if err != nil {
		return fmt.Errorf("tensor: CUDA device %d (%s): %w", ordinal, dev.Name(), err)
	}
	for _, fam := range kernels.Families() {
		m, err := dev.LoadModule(ptx[fam])
		if err != nil {
			return fmt.Errorf("tensor: CUDA device %d: loading the %s kernels: %w", ordinal, fam, err)
		}
		rt.modules = append(rt.modules, m)
	}
	if CUDAUnverified(os.Getenv, "mla") {
		SetCUDAAttentionHeadChunks(true)
	}
	if CUDAUnverified(os.Getenv, "cublaslt") {
		// products through cuBLASLt: load it now, so that a missing
		// library is this error rather than a failed product
		if _, _, err := dev.LtVersion(); err != nil {
			return fmt.Errorf("tensor: CUDA device %d: GOTRON_CUDA_UNVERIFIED turns on cublaslt (products through cuBLASLt): %w", ordinal, err)
		}
		SetCUDALt(true)
	}
	if CUDAUnverified(os.Getenv, "fp8") {
		// FP8 products (cuda_fp8.go): cuBLASLt's FP8 matmul runs on
		// compute capability 8.9 (Ada) and newer
		if major*10+minor < 89 {
			return fmt.Errorf("tensor: CUDA device %d (%s, compute capability %d.%d): GOTRON_CUDA_UNVERIFIED turns on fp8, whose FP8 products need compute capability 8.9 or newer", ordinal, dev.Name(), major, minor)
		}
		if _, _, err := dev.LtVersion(); err != nil {
			return fmt.Errorf("tensor: CUDA device %d: GOTRON_CUDA_UNVERIFIED turns on fp8 (FP8 products through cuBLASLt): %w", ordinal, err)
		}
		SetCUDAFP8(true)
	}
	rt.dev = dev
	cudaOpen.rt.Store(rt)
	return nil
}

// CUDADevice returns the open GPU's runtime device (memory statistics,
// synchronization, timing events), or nil when none is open.
func CUDADevice() *cuda.Device {
	if rt := cudaOpen.rt.Load(); rt != nil {
		return rt.dev
	}
	return nil
}

// cudaPeaks are dense datasheet peaks, FLOP/s, by a substring of the
// device name: 16-bit tensor-core products, and plain float32 (what
// MatmulFP32 runs on: no TF32).
var cudaPeaks = []struct {
	name       string
	half, fp32 float64
}{
	{"H100 PCIe", 756e12, 51.2e12},
	{"H100", 989.4e12, 66.9e12}, // SXM, and the H100 NVL is close
	{"H200", 989.4e12, 66.9e12},
	{"H800", 989.4e12, 66.9e12},
	{"A100", 312e12, 19.5e12},
	{"L40S", 362e12, 91.6e12},
}

// CUDAPeakFLOPs returns the open GPU's datasheet peak for MFU — 16-bit
// tensor-core products when half, else float32 — or 0 when no GPU is open
// or the GPU is not in gotron's table (pass --peak-flops then).
func CUDAPeakFLOPs(half bool) float64 {
	rt := cudaOpen.rt.Load()
	if rt == nil {
		return 0
	}
	name := rt.dev.Name()
	for _, p := range cudaPeaks {
		if strings.Contains(name, p.name) {
			if half {
				return p.half
			}
			return p.fp32
		}
	}
	return 0
}

// collectDeviceGarbage is the allocator's response to memory pressure: run
// the garbage collector so that unreachable tensors' cleanups return their
// device buffers, and give the cleanup goroutine a moment to run them.
func collectDeviceGarbage() {
	runtime.GC()
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
}

// cudaRT returns the open GPU, panicking when none is (a CUDA tensor cannot
// exist before OpenCUDA, so this is a programming error).
func cudaRT() *cudaRuntime {
	rt := cudaOpen.rt.Load()
	if rt == nil {
		panic("tensor: no CUDA device is open in this process (tensor.OpenCUDA, or --device cuda)")
	}
	return rt
}

// parseCUDA parses "cuda" or "cuda:N" into the ordinal N (0 for "cuda").
func parseCUDA(s string) (int, bool, error) {
	if s == "cuda" {
		return 0, true, nil
	}
	rest, ok := strings.CutPrefix(s, "cuda:")
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n > 1023 {
		return 0, true, fmt.Errorf("tensor: device %q: want cuda or cuda:N with N a GPU index", s)
	}
	return n, true, nil
}

// OpenDevice parses a --device value (cpu, sim, cuda, cuda:N) and, for a
// GPU, opens it (OpenCUDA): the device a program's tensors then go to.
// Plain "cuda" in a process of a launched job (localRank >= 0, the
// launcher's LOCAL_RANK) opens GPU localRank modulo the GPUs it sees, so
// that the ranks of a node spread over its GPUs as Megatron's do; otherwise
// GPU 0.
func OpenDevice(s string, localRank int, opts CUDAOptions) (Device, error) {
	if ord, ok, err := parseCUDA(s); ok {
		if err != nil {
			return CPU, err
		}
		if s == "cuda" && localRank > 0 {
			n, err := cuda.DeviceCount()
			if err != nil {
				return CPU, err
			}
			ord = localRank % n
		}
		if err := OpenCUDA(ord, opts); err != nil {
			return CPU, err
		}
		return CUDA, nil
	}
	return ParseDevice(s)
}

// devBuf is a block of device memory holding a tensor's storage (shared by
// its views). It goes back to the caching allocator once: explicitly when
// the tape that handed it out resets (free), or by the cleanup the garbage
// collector runs when no tensor refers to it any more.
type devBuf struct {
	ptr     cuda.Ptr
	bytes   int64
	rt      *cudaRuntime
	freed   atomic.Bool
	cleanup runtime.Cleanup
}

// DeviceError is what a tensor op panics with when the device fails it —
// out of device memory above all (the error names the allocation, the
// peak and the fix). Ops have no error results, as on the CPU, so the
// program's top level (gotron's commands) recovers it into an error.
type DeviceError struct{ Err error }

func (e *DeviceError) Error() string { return "tensor: " + e.Err.Error() }

func (e *DeviceError) Unwrap() error { return e.Err }

// newBuf allocates bytes of device memory, panicking with a DeviceError
// (the allocator's, which names the size, the peak and the fix) when it is
// out.
func (rt *cudaRuntime) newBuf(bytes int64) *devBuf {
	p, err := rt.dev.Alloc(bytes)
	if err != nil {
		panic(&DeviceError{Err: err})
	}
	b := &devBuf{ptr: p, bytes: bytes, rt: rt}
	dev := rt.dev
	b.cleanup = runtime.AddCleanup(b, func(p cuda.Ptr) { dev.Free(p) }, p)
	return b
}

// free returns b to the allocator now (once). Kernels already queued on
// the device's one stream finish before any later use of the memory.
func (b *devBuf) free() {
	if b.freed.CompareAndSwap(false, true) {
		b.cleanup.Stop()
		b.rt.dev.Free(b.ptr)
	}
}

// newCUDA returns a contiguous tensor of dtype and shape on the GPU, zeroed
// when zero is set.
func newCUDA(dtype DType, shape []int, zero bool) *Tensor {
	rt := cudaRT()
	n := numel(shape)
	bytes := int64(n) * int64(dtype.Size())
	t := &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: dtype, dev: CUDA, leaf: true}
	t.dbuf = rt.newBuf(bytes)
	if zero && bytes > 0 {
		rt.timed("memset of a zeroed allocation", func() {
			if err := rt.dev.Memset(t.dbuf.ptr, bytes); err != nil {
				panic(fmt.Sprintf("tensor: clearing %s on CUDA: %v", t, err))
			}
		})
	}
	return t
}

// hostData returns the address and byte size of contiguous host-readable
// t's elements (on the CPU or the simulated device).
func hostData(t *Tensor) (unsafe.Pointer, int64) {
	n := t.Numel()
	size := int64(n) * int64(t.dtype.Size())
	if n == 0 {
		return nil, 0
	}
	switch t.dtype {
	case Float32:
		return unsafe.Pointer(&t.f32[t.offset]), size
	case BFloat16, Float16:
		return unsafe.Pointer(&t.u16[t.offset]), size
	case Int32:
		return unsafe.Pointer(&t.i32[t.offset]), size
	case Int64:
		return unsafe.Pointer(&t.i64[t.offset]), size
	}
	panic(fmt.Sprintf("tensor: unknown dtype %v", t.dtype))
}

// devPtr returns the device address of CUDA tensor t's element 0.
func devPtr(t *Tensor) cuda.Ptr {
	if t.dev != CUDA || t.dbuf == nil {
		panic(fmt.Sprintf("tensor: %s is not on the CUDA device (it is on %v)", t, t.dev))
	}
	return t.dbuf.ptr + cuda.Ptr(int64(t.offset)*int64(t.dtype.Size()))
}

// toCUDA returns a contiguous GPU copy of t (on the CPU or sim), counted
// under site ("": the caller's function, copySite).
func toCUDA(t *Tensor, site string) *Tensor {
	out := newCUDA(t.dtype, t.shape, false)
	copyToCUDA(out, t, site)
	return out
}

// copyToCUDA copies host-readable src (any view) into contiguous GPU
// tensor dst of the same dtype and element count, counted under site.
func copyToCUDA(dst, src *Tensor, site string) {
	if !src.IsContiguous() {
		src = src.Contiguous()
	}
	p, n := hostData(src)
	if n > 0 {
		rt := dst.dbuf.rt
		if site == "" {
			site = copySite()
		}
		rt.copies.count(site, false, n)
		copyFn, what := rt.dev.CopyHtoD, "copy host to device"
		if rt.stagedCopies && n <= cuda.StagingSlotBytes {
			// through page-locked staging, without waiting for the stream
			copyFn, what = rt.dev.CopyHtoDStaged, "copy host to device (staged)"
		}
		rt.timed(rt.copyName(what, site), func() {
			if err := copyFn(devPtr(dst), p, n); err != nil {
				panic(fmt.Sprintf("tensor: copying %s to CUDA: %v", src, err))
			}
		})
	}
	runtime.KeepAlive(src)
}

// copyFromCUDA copies GPU tensor src (any view) into contiguous
// host-readable dst of the same dtype and element count, counted under
// site.
func copyFromCUDA(dst, src *Tensor, site string) {
	if !src.IsContiguous() {
		src = src.Contiguous() // on the GPU
	}
	p, n := hostData(dst)
	if n > 0 {
		rt := src.dbuf.rt
		if site == "" {
			site = copySite()
		}
		rt.copies.count(site, true, n)
		rt.timed(rt.copyName("copy device to host", site), func() {
			if err := src.dbuf.rt.dev.CopyDtoH(p, devPtr(src), n); err != nil {
				panic(fmt.Sprintf("tensor: copying %s from CUDA: %v", src, err))
			}
		})
	}
	runtime.KeepAlive(dst)
}

// fromCUDA returns a dense host copy of GPU tensor t on dev (CPU or sim),
// counted under site.
func fromCUDA(t *Tensor, dev Device, site string) *Tensor {
	out := New(t.dtype, t.shape...)
	out.dev = dev
	copyFromCUDA(out, t, site)
	return out
}

// cudaBackend is the CUDA device's Backend: its methods live in
// tensor/cuda_backend_*.go, over the kernels of internal/cuda/kernels.
type cudaBackend struct {
	rt *cudaRuntime
}

var _ Backend = cudaBackend{}

// CUDABackend returns the open GPU's backend (tensor/backendtest runs its
// method-level checks on it), or nil when no GPU is open.
func CUDABackend() Backend {
	rt := cudaOpen.rt.Load()
	if rt == nil {
		return nil
	}
	return cudaBackend{rt: rt}
}

func (cudaBackend) Name() string { return "cuda" }

func (cudaBackend) Device() Device { return CUDA }

// ptr returns the device address of t's element 0 (its offset applied).
func (b cudaBackend) ptr(t *Tensor) uintptr {
	if t == nil {
		return 0
	}
	return uintptr(devPtr(t))
}

// fn returns the kernel named name from the loaded modules.
func (b cudaBackend) fn(name string) *cuda.Function {
	if f, ok := b.rt.fns.Load(name); ok {
		return f.(*cuda.Function)
	}
	for _, m := range b.rt.modules {
		if f, err := m.Function(name); err == nil {
			b.rt.fns.Store(name, f)
			return f
		}
	}
	panic(fmt.Sprintf("tensor: CUDA kernel %s is in none of the loaded modules (internal/cuda/kernels)", name))
}

// launch runs kernel on grid×block threads with shmem bytes of dynamic
// shared memory, on the device's stream; it panics naming the kernel when
// the launch fails.
func (b cudaBackend) launch(kernel string, grid, block [3]int, shmem int, args ...any) {
	for _, d := range [][3]int{grid, block} {
		for _, v := range d {
			if v <= 0 || v > 1<<31-1 {
				panic(fmt.Sprintf("tensor: CUDA kernel %s: launch dimensions grid %v block %v", kernel, grid, block))
			}
		}
	}
	g := cuda.Dim3{X: uint32(grid[0]), Y: uint32(grid[1]), Z: uint32(grid[2])}
	bl := cuda.Dim3{X: uint32(block[0]), Y: uint32(block[1]), Z: uint32(block[2])}
	f := b.fn(kernel)
	b.rt.timed(kernel, func() {
		if err := b.rt.dev.Launch(f, g, bl, uint32(shmem), args...); err != nil {
			panic(fmt.Sprintf("tensor: CUDA kernel %s: %v", kernel, err))
		}
	})
}

// launch1D runs kernel on blocks of 256 threads covering n elements (at
// most 65535·8 blocks: kernels loop grid-stride); nothing when n is 0.
func (b cudaBackend) launch1D(kernel string, n int, args ...any) {
	if n <= 0 {
		return
	}
	blocks := min((n+255)/256, 65535*8)
	b.launch(kernel, [3]int{blocks, 1, 1}, [3]int{256, 1, 1}, 0, args...)
}

// alloc returns a new zeroed contiguous tensor on the GPU.
func (b cudaBackend) alloc(dtype DType, shape ...int) *Tensor { return newCUDA(dtype, shape, true) }

// empty returns a new uninitialised contiguous tensor on the GPU.
func (b cudaBackend) empty(dtype DType, shape ...int) *Tensor { return newCUDA(dtype, shape, false) }

// constant returns the GPU copy of a host constant (RoPE's tables), made
// by mk once per key and kept for the process's life.
func (b cudaBackend) constant(key any, mk func() *Tensor) *Tensor {
	b.rt.constMu.Lock()
	defer b.rt.constMu.Unlock()
	if t, ok := b.rt.consts[key]; ok {
		return t
	}
	t := toCUDA(mk(), "device constants (RoPE tables)")
	b.rt.consts[key] = t
	return t
}

// Gemm runs on cuBLAS, which is column-major: the row-major product
// C = op(A)·op(B) is, read column-major, Cᵀ = op(B)ᵀ·op(A)ᵀ, so B goes
// first and the dimensions swap. A weight shared by every batch entry has
// stride 0. BF16 and FP16 use cuBLAS's compute types that round the float32
// operands to 16 bits and accumulate in float32 (MatmulBF16's contract);
// FP32 is full float32 (no TF32, as PyTorch's default).
func (b cudaBackend) Gemm(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, bm *Tensor, beta float32, c *Tensor) {
	if cudaLt.Load() && b.ltGemm(prec, tA, tB, alpha, a, bm, beta, c) {
		return
	}
	p, ok := cudaGemmParams(prec, tA, tB, alpha, a, bm, beta, c)
	if !ok {
		return
	}
	p.A, p.B, p.C = devPtr(bm), devPtr(a), devPtr(c)
	name := "cublas gemm " + prec.String()
	if p.AType == cuda.BF16 {
		name += " (bf16 operands)"
	}
	b.rt.timed(name, func() {
		if err := b.rt.dev.GemmStridedBatched(p); err != nil {
			panic(fmt.Sprintf("tensor: CUDA Gemm %dx%dx%d (batch %d): %v", p.N, p.M, p.K, p.Batch, err))
		}
	})
}

// cudaGemmParams is Gemm's cuBLAS call without its device addresses (the
// caller sets A = bm's, B = a's, C = c's): false when c is empty. It takes
// tensors on any device, so TestCUDAGemmParams checks it without a GPU.
func cudaGemmParams(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, bm *Tensor, beta float32, c *Tensor) (cuda.GemmParams, bool) {
	m, n := c.Dim(-2), c.Dim(-1)
	k := a.Dim(-1)
	if tA == Trans {
		k = a.Dim(-2)
	}
	if m == 0 || n == 0 {
		return cuda.GemmParams{}, false
	}
	batch := c.Numel() / (m * n)
	lda, ldb := a.Dim(-1), bm.Dim(-1)
	sa, sb := int64(a.Dim(-1)*a.Dim(-2)), int64(bm.Dim(-1)*bm.Dim(-2))
	if int64(a.Numel()) == sa {
		sa = 0
	}
	if int64(bm.Numel()) == sb {
		sb = 0
	}
	compute, operands := cuda.Compute32F, cuda.F32
	switch {
	case prec == MatmulBF16 && a.dtype == BFloat16 && bm.dtype == BFloat16:
		// bfloat16 operands (gemm-bf16, bf16_operands.go): CUDA_R_16BF A
		// and B, CUDA_R_32F C, CUBLAS_COMPUTE_32F — a combination
		// cublasGemmStridedBatchedEx accepts (cuBLAS's GemmEx type table:
		// compute 32F, scale 32F, A/B 16BF with C 16BF or 32F), which
		// internal/cuda's TestGPUGemmBF16 ran on the H100.
		operands = cuda.BF16
	case a.dtype != Float32 || bm.dtype != Float32 || c.dtype != Float32:
		panic(fmt.Sprintf("tensor: CUDA Gemm of %v by %v into %v under %v: want float32 operands, or bfloat16 ones under bf16, and a float32 result", a.dtype, bm.dtype, c.dtype, prec))
	case prec == MatmulBF16:
		compute = cuda.Compute32FFast16BF
	case prec == MatmulFP16:
		compute = cuda.Compute32FFast16F
	}
	if c.dtype != Float32 {
		panic(fmt.Sprintf("tensor: CUDA Gemm into %v: want a float32 result", c.dtype))
	}
	return cuda.GemmParams{
		TransA: tB == Trans, TransB: tA == Trans,
		M: n, N: m, K: k,
		Alpha: alpha, Beta: beta,
		AType: operands, LDA: ldb, StrideA: sb,
		BType: operands, LDB: lda, StrideB: sa,
		CType: cuda.F32, LDC: n, StrideC: int64(m * n),
		Batch:   batch,
		Compute: compute,
	}, true
}
