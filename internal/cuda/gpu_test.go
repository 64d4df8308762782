package cuda

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// The tests in this file need an NVIDIA GPU; they skip where no driver
// library is found, and fail where one is found but does not work.

var testDevice struct {
	once sync.Once
	d    *Device
	err  error
	skip string
}

func gpu(t testing.TB) *Device {
	t.Helper()
	testDevice.once.Do(func() {
		if _, err := loadDriver(); err != nil {
			testDevice.skip = "no CUDA driver: " + err.Error()
			return
		}
		testDevice.d, testDevice.err = Open(0, Options{})
		var e *Error
		if errors.As(testDevice.err, &e) && (e.Code == errorNoDevice || e.Code == errorNotInitialized) {
			testDevice.skip = "no CUDA device: " + testDevice.err.Error()
		}
	})
	if testDevice.skip != "" {
		t.Skip(testDevice.skip)
	}
	if testDevice.err != nil {
		t.Fatalf("Open(0): %v", testDevice.err)
	}
	return testDevice.d
}

const vaddPTX = `.version 7.0
.target sm_52
.address_size 64
.visible .entry vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{
  .reg .pred p;
  .reg .b32 r<5>;
  .reg .b64 rd<8>;
  .reg .f32 f<4>;
  ld.param.u64 rd1, [pa];
  ld.param.u64 rd2, [pb];
  ld.param.u64 rd3, [pc];
  ld.param.u32 r1, [pn];
  mov.u32 r2, %ctaid.x;
  mov.u32 r3, %ntid.x;
  mov.u32 r4, %tid.x;
  mad.lo.s32 r2, r2, r3, r4;
  setp.ge.u32 p, r2, r1;
  @p bra DONE;
  cvta.to.global.u64 rd1, rd1;
  cvta.to.global.u64 rd2, rd2;
  cvta.to.global.u64 rd3, rd3;
  mul.wide.u32 rd4, r2, 4;
  add.s64 rd5, rd1, rd4;
  add.s64 rd6, rd2, rd4;
  add.s64 rd7, rd3, rd4;
  ld.global.f32 f1, [rd5];
  ld.global.f32 f2, [rd6];
  add.f32 f3, f1, f2;
  st.global.f32 [rd7], f3;
DONE:
  ret;
}
`

// upload copies a float32 slice to a new device block.
func upload(t *testing.T, d *Device, x []float32) Ptr {
	t.Helper()
	p, err := d.Alloc(int64(4 * len(x)))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CopyHtoD(p, unsafe.Pointer(&x[0]), int64(4*len(x))); err != nil {
		t.Fatal(err)
	}
	return p
}

func download(t *testing.T, d *Device, p Ptr, n int) []float32 {
	t.Helper()
	x := make([]float32, n)
	if err := d.CopyDtoH(unsafe.Pointer(&x[0]), p, int64(4*n)); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestGPUOpen(t *testing.T) {
	d := gpu(t)
	major, minor := d.ComputeCapability()
	t.Logf("%v; cuBLAS %v", d, func() any { v, p := d.BLASVersion(); return []any{v, p} }())
	if d.Name() == "" || major < 5 || d.TotalMemory() < 1<<30 || d.DriverVersion() < 11000 {
		t.Errorf("implausible device: %q sm_%d%d %d bytes driver %d", d.Name(), major, minor, d.TotalMemory(), d.DriverVersion())
	}
	if _, err := Open(1000, Options{}); err == nil || !strings.Contains(err.Error(), "no GPU number 1000") {
		t.Errorf("Open(1000): %v", err)
	}
	free, total, err := d.MemInfo()
	if err != nil || free <= 0 || total != d.TotalMemory() {
		t.Errorf("MemInfo: %d %d %v", free, total, err)
	}
}

func TestGPUCopiesAndMemset(t *testing.T) {
	d := gpu(t)
	const n = 1<<20 + 3
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i) * 0.5
	}
	p := upload(t, d, x)
	defer d.Free(p)
	q, err := d.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(q)
	if uintptr(p)%256 != 0 || uintptr(q)%256 != 0 {
		t.Errorf("blocks %#x %#x not 256-byte aligned", uintptr(p), uintptr(q))
	}
	if err := d.CopyDtoD(q, p, 4*n); err != nil {
		t.Fatal(err)
	}
	y := download(t, d, q, n)
	for i := range x {
		if y[i] != x[i] {
			t.Fatalf("round trip [%d] = %g, want %g", i, y[i], x[i])
		}
	}
	// Zero the middle: bytes [4*100, 4*200) only.
	if err := d.Memset(q+400, 400); err != nil {
		t.Fatal(err)
	}
	y = download(t, d, q, n)
	for i := range y {
		want := x[i]
		if i >= 100 && i < 200 {
			want = 0
		}
		if y[i] != want {
			t.Fatalf("after Memset [%d] = %g, want %g", i, y[i], want)
		}
	}
	z, err := d.Alloc(0)
	if err != nil || z == 0 {
		t.Errorf("Alloc(0) = %#x, %v", uintptr(z), err)
	}
	d.Free(z)
}

func TestGPULaunchVadd(t *testing.T) {
	d := gpu(t)
	mod, err := d.LoadModule([]byte(vaddPTX))
	if err != nil {
		t.Fatal(err)
	}
	f, err := mod.Function("vadd")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mod.Function("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("missing kernel: %v", err)
	}
	const n = 1<<20 + 17
	a, b := make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i] = float32(i), float32(2*i)
	}
	pa, pb := upload(t, d, a), upload(t, d, b)
	pc, _ := d.Alloc(4 * n)
	defer func() { d.Free(pa); d.Free(pb); d.Free(pc) }()
	grid := Dim3{X: (n + 255) / 256}
	if err := d.Launch(f, grid, Dim3{X: 256}, 0, pa, uintptr(pb), pc, uint32(n)); err != nil {
		t.Fatal(err)
	}
	c := download(t, d, pc, n)
	for i := range c {
		if c[i] != float32(3*i) {
			t.Fatalf("vadd [%d] = %g, want %d", i, c[i], 3*i)
		}
	}
	// More than 48 KiB of dynamic shared memory needs the function attribute.
	if err := d.Launch(f, grid, Dim3{X: 256}, 100<<10, pa, pb, pc, uint32(n)); err != nil {
		t.Errorf("launch with 100 KiB shared memory: %v", err)
	}
	if err := d.Launch(f, grid, Dim3{X: 256}, 0, pa, pb, pc, 7); err == nil || !strings.Contains(err.Error(), "vadd") {
		t.Errorf("int argument accepted: %v", err)
	}
	// Goroutines on whatever threads: each call makes the context current.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := d.Launch(f, grid, Dim3{X: 256}, 0, pa, pb, pc, uint32(n)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := mod.Unload(); err != nil {
		t.Error(err)
	}
}

func TestGPULoadModuleReportsJITLog(t *testing.T) {
	d := gpu(t)
	bad := strings.Replace(vaddPTX, "add.f32 f3, f1, f2;", "add.f32 f3, f1, f9;", 1)
	_, err := d.LoadModule([]byte(bad))
	if err == nil {
		t.Fatal("bad PTX loaded")
	}
	if !strings.Contains(err.Error(), "JIT log") {
		t.Errorf("error lacks the JIT log: %v", err)
	}
	t.Logf("bad PTX: %v", err)
}

func TestGPUEvents(t *testing.T) {
	d := gpu(t)
	start, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	end, _ := d.NewEvent()
	defer start.Destroy()
	defer end.Destroy()
	p, _ := d.Alloc(256 << 20)
	defer d.Free(p)
	if err := start.Record(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := d.Memset(p, 256<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := end.Record(); err != nil {
		t.Fatal(err)
	}
	el, err := start.Elapsed(end)
	if err != nil {
		t.Fatal(err)
	}
	if el <= 0 || el.Seconds() > 5 {
		t.Errorf("1 GiB of memset took %v", el)
	}
	t.Logf("1 GiB of memset: %v (%.0f GB/s)", el, 1.0737e9/el.Seconds()/1e9)
}

// hostGemm is the row-major reference C[m×n] = A[m×k]·B[k×n].
func hostGemm(a, b []float32, m, n, k int) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for l := range k {
				s += float64(a[i*k+l]) * float64(b[l*n+j])
			}
			c[i*n+j] = s
		}
	}
	return c
}

func toBF16(x float32) uint16 {
	u := math.Float32bits(x)
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

func fromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func TestGPUGemmF32(t *testing.T) {
	d := gpu(t)
	const m, n, k, batch = 37, 53, 129, 3
	rng := rand.New(rand.NewSource(1))
	a, b := make([]float32, batch*m*k), make([]float32, batch*k*n)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	pa, pb := upload(t, d, a), upload(t, d, b)
	pc, _ := d.Alloc(4 * batch * m * n)
	defer func() { d.Free(pa); d.Free(pb); d.Free(pc) }()
	for _, compute := range []ComputeType{Compute32F, Compute32FFastTF32} {
		// Row-major C = A·B is column-major C^T = B^T·A^T: B first, M and N swapped.
		err := d.GemmStridedBatched(GemmParams{
			M: n, N: m, K: k, Alpha: 1,
			A: pb, LDA: n, StrideA: k * n,
			B: pa, LDB: k, StrideB: m * k,
			C: pc, LDC: n, StrideC: m * n,
			Batch: batch, AType: F32, BType: F32, CType: F32, Compute: compute,
		})
		if err != nil {
			t.Fatal(err)
		}
		c := download(t, d, pc, batch*m*n)
		tol := 1e-4
		if compute == Compute32FFastTF32 {
			tol = 2e-2
		}
		for s := range batch {
			want := hostGemm(a[s*m*k:], b[s*k*n:], m, n, k)
			for i, w := range want {
				if g := float64(c[s*m*n+i]); math.Abs(g-w) > tol*(1+math.Abs(w)) {
					t.Fatalf("compute %d batch %d [%d] = %g, want %g", compute, s, i, g, w)
				}
			}
		}
	}
	// Transposed operands and Beta: C = 2·A^T·B^T + 0.5·C, row-major with
	// A stored k×m and B stored n×k; column-major that is C^T = 2·B·A + 0.5·C^T.
	at, bt := make([]float32, k*m), make([]float32, n*k)
	for i := range m {
		for l := range k {
			at[l*m+i] = a[i*k+l]
		}
	}
	for l := range k {
		for j := range n {
			bt[j*k+l] = b[l*n+j]
		}
	}
	pat, pbt := upload(t, d, at), upload(t, d, bt)
	defer func() { d.Free(pat); d.Free(pbt) }()
	c0 := download(t, d, pc, m*n)
	err := d.GemmStridedBatched(GemmParams{
		TransA: true, TransB: true, M: n, N: m, K: k, Alpha: 2, Beta: 0.5,
		A: pbt, LDA: k, B: pat, LDB: m, C: pc, LDC: n,
		AType: F32, BType: F32, CType: F32,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := download(t, d, pc, m*n)
	want := hostGemm(a, b, m, n, k)
	for i, w := range want {
		w = 2*w + 0.5*float64(c0[i])
		if g := float64(c[i]); math.Abs(g-w) > 1e-4*(1+math.Abs(w)) {
			t.Fatalf("transposed [%d] = %g, want %g", i, g, w)
		}
	}
	if err := d.GemmStridedBatched(GemmParams{M: 4, N: 4, K: 4, A: pa, B: pb, C: pc, LDA: 2, LDB: 4, LDC: 4}); err == nil {
		t.Errorf("LDA < M accepted")
	}
}

func TestGPUGemmBF16(t *testing.T) {
	d := gpu(t)
	const m, n, k, batch = 64, 96, 256, 2
	rng := rand.New(rand.NewSource(2))
	// Small integers times 1/8: exact in bf16, products and sums exact in fp32.
	a16, b16 := make([]uint16, batch*m*k), make([]uint16, batch*k*n)
	a, b := make([]float32, len(a16)), make([]float32, len(b16))
	for i := range a16 {
		a16[i] = toBF16(float32(rng.Intn(17)-8) / 8)
		a[i] = fromBF16(a16[i])
	}
	for i := range b16 {
		b16[i] = toBF16(float32(rng.Intn(17)-8) / 8)
		b[i] = fromBF16(b16[i])
	}
	up16 := func(x []uint16) Ptr {
		p, err := d.Alloc(int64(2 * len(x)))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CopyHtoD(p, unsafe.Pointer(&x[0]), int64(2*len(x))); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pa, pb := up16(a16), up16(b16)
	pc32, _ := d.Alloc(4 * batch * m * n)
	pc16, _ := d.Alloc(2 * batch * m * n)
	defer func() { d.Free(pa); d.Free(pb); d.Free(pc32); d.Free(pc16) }()
	p := GemmParams{
		M: n, N: m, K: k, Alpha: 1,
		A: pb, LDA: n, StrideA: k * n,
		B: pa, LDB: k, StrideB: m * k,
		LDC: n, StrideC: m * n,
		Batch: batch, AType: BF16, BType: BF16, Compute: Compute32F,
	}
	p.C, p.CType = pc32, F32
	if err := d.GemmStridedBatched(p); err != nil {
		t.Fatal(err)
	}
	p.C, p.CType = pc16, BF16
	if err := d.GemmStridedBatched(p); err != nil {
		t.Fatal(err)
	}
	c32 := download(t, d, pc32, batch*m*n)
	c16 := make([]uint16, batch*m*n)
	if err := d.CopyDtoH(unsafe.Pointer(&c16[0]), pc16, int64(2*len(c16))); err != nil {
		t.Fatal(err)
	}
	for s := range batch {
		want := hostGemm(a[s*m*k:], b[s*k*n:], m, n, k)
		for i, w := range want {
			if g := c32[s*m*n+i]; float64(g) != w {
				t.Fatalf("bf16→f32 batch %d [%d] = %g, want %g exactly", s, i, g, w)
			}
			if g := fromBF16(c16[s*m*n+i]); g != fromBF16(toBF16(float32(w))) {
				t.Fatalf("bf16→bf16 batch %d [%d] = %g, want %g (bf16 of %g)", s, i, g, fromBF16(toBF16(float32(w))), w)
			}
		}
	}
}

func TestGPUAllocatorOnDevice(t *testing.T) {
	gpu(t)
	pressure := 0
	d, err := Open(0, Options{MemoryFraction: 0.01, OnPressure: func() { pressure++ }, BLASWorkspace: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	limit := int64(0.01 * float64(d.TotalMemory()))
	p, err := d.Alloc(limit / 2)
	if err != nil {
		t.Fatal(err)
	}
	d.Free(p)
	q, err := d.Alloc(limit / 2)
	if err != nil || q != p {
		t.Errorf("freed block not reused: %#x vs %#x, %v", uintptr(q), uintptr(p), err)
	}
	_, err = d.Alloc(limit)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || pressure != 1 || !strings.Contains(err.Error(), "--micro-batch-size") {
		t.Errorf("over the limit: %v (OnPressure called %d times)", err, pressure)
	}
	d.Free(q)
	if err := d.EmptyCache(); err != nil {
		t.Error(err)
	}
	s := d.MemStats()
	if s.Reserved != s.InUse || s.InUse != roundSize(1<<20) {
		t.Errorf("after EmptyCache: %+v (only the cuBLAS workspace should remain)", s)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	g := GemmParams{M: 1, N: 1, K: 1, A: 256, B: 256, C: 256, LDA: 1, LDB: 1, LDC: 1}
	if err := d.GemmStridedBatched(g); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("GEMM on a closed device: %v", err)
	}
}

// TestGPUCopyHtoDStaged: staged copies (more than the ring has slots, so
// slots are reused, and one above the slot size, which takes CopyHtoD) land
// where they should, ordered after a memset queued before them, although
// the host buffer is overwritten right after each call.
func TestGPUCopyHtoDStaged(t *testing.T) {
	d := gpu(t)
	const region = 1000 // float32s per copy
	copies := 3*stagingSlots + 1
	total := copies*region + StagingSlotBytes/4 + 7
	p, err := d.Alloc(int64(4 * total))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	if err := d.Memset(p, int64(4*total)); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, total)
	buf := make([]float32, StagingSlotBytes/4+7)
	for c := range copies {
		for i := range region {
			buf[i] = float32(c*region + i + 1)
			want[c*region+i] = buf[i]
		}
		if err := d.CopyHtoDStaged(p+Ptr(4*c*region), unsafe.Pointer(&buf[0]), 4*region); err != nil {
			t.Fatal(err)
		}
		clear(buf) // the staged copy must not read buf any more
	}
	for i := range buf { // above a slot: CopyHtoD
		buf[i] = -float32(i + 1)
		want[copies*region+i] = buf[i]
	}
	if err := d.CopyHtoDStaged(p+Ptr(4*copies*region), unsafe.Pointer(&buf[0]), int64(4*len(buf))); err != nil {
		t.Fatal(err)
	}
	got := download(t, d, p, total)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("element %d: %g, want %g", i, got[i], want[i])
		}
	}
}
