package cuda

import (
	"bytes"
	"fmt"
	"math"
	"math/rand"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// groupedPrototype returns the parameters (C type, name) of
// cublasGemmGroupedBatchedEx as declared in blas_grouped.go's copy of
// cublas_api.h's declaration.
func groupedPrototype(t *testing.T) [][2]string {
	t.Helper()
	src, err := os.ReadFile("blas_grouped.go")
	if os.IsNotExist(err) {
		// A test binary run away from its sources (tools/gpu/check.sh
		// on the GPU machine): go test, which runs it in the package's
		// folder, checks the declaration everywhere else.
		t.Skip("blas_grouped.go not in the working directory: this source check runs under go test")
	}
	if err != nil {
		t.Fatal(err)
	}
	var decl strings.Builder
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "//")
		if strings.Contains(line, "cublasGemmGroupedBatchedEx(cublasHandle_t handle,") {
			in = true
			line = line[strings.Index(line, "(")+1:]
		}
		if in {
			decl.WriteString(line)
			if strings.Contains(line, ");") {
				break
			}
		}
	}
	body := strings.TrimSuffix(strings.TrimSpace(decl.String()), ");")
	if body == "" {
		t.Fatal("blas_grouped.go: no declaration of cublasGemmGroupedBatchedEx found")
	}
	ident := regexp.MustCompile(`(\w+)$`)
	var params [][2]string
	for _, p := range strings.Split(body, ",") {
		p = strings.TrimSpace(p)
		array := strings.HasSuffix(p, "[]")
		p = strings.TrimSuffix(p, "[]")
		m := ident.FindStringIndex(p)
		if m == nil || m[0] == 0 {
			t.Fatalf("parameter %q: want a type and a name", p)
		}
		typ := strings.TrimSpace(p[:m[0]])
		if array {
			typ += "[]"
		}
		params = append(params, [2]string{typ, p[m[0]:]})
	}
	return params
}

// TestGroupedGemmArgsMatchPrototype checks, without a GPU, the arguments
// GemmGrouped hands to cublasGemmGroupedBatchedEx against cuBLAS's
// declaration: the same 20 parameters in the same order; every host array
// holding the groups' values as C ints (cublasOperation_t is a C enum) or
// floats; the device-pointer arrays at their offsets in the uploaded
// buffer; the scalars as C ints. Then it passes the very argument list,
// after a buffer, its size and a format built from the declared types
// (pointers %lx, the rest %d), to libc's snprintf through purego, as the
// GEMM call does: the 20 values it prints are the ones meant for each
// parameter, so purego places them where a C callee of that prototype
// reads them.
func TestGroupedGemmArgsMatchPrototype(t *testing.T) {
	params := groupedPrototype(t)
	if len(params) != len(groupedGemmArgs) {
		t.Fatalf("declaration has %d parameters, groupedGemmArgs %d", len(params), len(groupedGemmArgs))
	}
	for i, p := range params {
		if p[1] != groupedGemmArgs[i] {
			t.Fatalf("parameter %d: declared %q, groupedGemmArgs has %q", i, p[1], groupedGemmArgs[i])
		}
	}
	groups := []GemmGroup{
		{TransA: true, M: 3, N: 5, K: 7, Alpha: 1, Beta: 0.5, A: 0x1000, LDA: 7, B: 0x2000, LDB: 7, C: 0x3000, LDC: 3},
		{TransB: true, M: 11, N: 13, K: 17, Alpha: -2, Beta: 1, A: 0x4000, LDA: 11, B: 0x5000, LDB: 13, C: 0x6000, LDC: 11},
	}
	if err := checkGroups(groups); err != nil {
		t.Fatal(err)
	}
	c := newGroupedGemmCall(groups)
	const handle, ptrs = uintptr(0xabc0), Ptr(0x7f0000)
	args := c.marshal(handle, ptrs, F32, BF16, F16, Compute32FFastTF32)
	if len(args) != len(params) {
		t.Fatalf("marshal: %d arguments, the prototype %d", len(args), len(params))
	}
	// the host arrays each pointer argument must point at
	hostInts := map[string][]int32{"transa_array": c.transA, "transb_array": c.transB, "m_array": c.m, "n_array": c.n, "k_array": c.k,
		"lda_array": c.lda, "ldb_array": c.ldb, "ldc_array": c.ldc, "group_size": c.size}
	hostFloats := map[string][]float32{"alpha_array": c.alpha, "beta_array": c.beta}
	ints := func(name string, p uintptr) []int32 {
		s := hostInts[name]
		if p != uintptr(unsafe.Pointer(&s[0])) {
			t.Fatalf("%s = %#x, not its host array", name, p)
		}
		return s
	}
	floats := func(name string, p uintptr) []float32 {
		s := hostFloats[name]
		if p != uintptr(unsafe.Pointer(&s[0])) {
			t.Fatalf("%s = %#x, not its host array", name, p)
		}
		return s
	}
	perGroup := map[string]func(g GemmGroup) int32{
		"transa_array": func(g GemmGroup) int32 { return map[bool]int32{false: 0, true: 1}[g.TransA] },
		"transb_array": func(g GemmGroup) int32 { return map[bool]int32{false: 0, true: 1}[g.TransB] },
		"m_array":      func(g GemmGroup) int32 { return int32(g.M) },
		"n_array":      func(g GemmGroup) int32 { return int32(g.N) },
		"k_array":      func(g GemmGroup) int32 { return int32(g.K) },
		"lda_array":    func(g GemmGroup) int32 { return int32(g.LDA) },
		"ldb_array":    func(g GemmGroup) int32 { return int32(g.LDB) },
		"ldc_array":    func(g GemmGroup) int32 { return int32(g.LDC) },
		"group_size":   func(GemmGroup) int32 { return 1 },
	}
	scalars := map[string]uintptr{"handle": handle, "Atype": uintptr(F32), "Btype": uintptr(BF16), "Ctype": uintptr(F16),
		"group_count": uintptr(len(groups)), "computeType": uintptr(Compute32FFastTF32)}
	devArrays := map[string]int{"Aarray": 0, "Barray": 1, "Carray": 2}
	format := make([]string, len(params))
	want := make([]string, len(params))
	for i, p := range params {
		typ, name, a := p[0], p[1], args[i]
		pointer := strings.Contains(typ, "*") || strings.HasSuffix(typ, "[]") || name == "handle"
		format[i], want[i] = "%d", fmt.Sprint(int32(a))
		if pointer {
			format[i], want[i] = "%lx", strconv.FormatUint(uint64(a), 16)
		}
		switch f, ok := perGroup[name]; {
		case ok:
			if !strings.HasPrefix(typ, "const int") && !strings.HasPrefix(typ, "const cublasOperation_t") {
				t.Fatalf("%s: declared %q, marshalled as a C int array", name, typ)
			}
			for gi, v := range ints(name, a) {
				if v != f(groups[gi]) {
					t.Errorf("%s[%d] = %d, want %d", name, gi, v, f(groups[gi]))
				}
			}
		case name == "alpha_array" || name == "beta_array":
			for gi, v := range floats(name, a) {
				w := groups[gi].Alpha
				if name == "beta_array" {
					w = groups[gi].Beta
				}
				if v != w {
					t.Errorf("%s[%d] = %g, want %g", name, gi, v, w)
				}
			}
		case devArrays[name] > 0 || name == "Aarray":
			if w := uintptr(ptrs) + uintptr(8*len(groups)*devArrays[name]); a != w {
				t.Errorf("%s = %#x, want the pointer buffer %#x + %d arrays", name, a, uintptr(ptrs), devArrays[name])
			}
			for gi, g := range groups {
				w := []Ptr{g.A, g.B, g.C}[devArrays[name]]
				if got := c.ptrs[devArrays[name]*len(groups)+gi]; got != uint64(w) {
					t.Errorf("%s[%d] uploads %#x, want %#x", name, gi, got, uint64(w))
				}
			}
		default:
			w, ok := scalars[name]
			if !ok {
				t.Fatalf("parameter %s (%s): not checked", name, typ)
			}
			if pointer != (name == "handle") {
				t.Fatalf("%s: declared %q", name, typ)
			}
			if a != w {
				t.Errorf("%s = %#x, want %#x", name, a, w)
			}
		}
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skip("no libc.so.6: ", err)
	}
	snprintf, err := purego.Dlsym(libc, "snprintf")
	if err != nil {
		t.Skip(err)
	}
	fmtC := cString(strings.Join(format, " "))
	buf := make([]byte, 1024)
	purego.SyscallN(snprintf, append([]uintptr{uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&fmtC[0]))}, args...)...)
	runtime.KeepAlive(fmtC)
	runtime.KeepAlive(c)
	if got := string(buf[:bytes.IndexByte(buf, 0)]); got != strings.Join(want, " ") {
		t.Errorf("the arguments as a C callee reads them:\n%s\nwant\n%s", got, strings.Join(want, " "))
	}
}

// TestGroupedGemmRefusesBadGroups: sizes, leading dimensions, addresses and
// unsupported types are refused before cuBLAS is called, naming the group.
func TestGroupedGemmRefusesBadGroups(t *testing.T) {
	ok := GemmGroup{M: 2, N: 3, K: 4, A: 0x10, LDA: 2, B: 0x20, LDB: 4, C: 0x30, LDC: 2}
	bad := ok
	bad.LDA = 1
	if err := checkGroups([]GemmGroup{ok, bad}); err == nil || !strings.Contains(err.Error(), "group 1") || !strings.Contains(err.Error(), "LDA 1 < 2") {
		t.Errorf("LDA below M: %v", err)
	}
	zero := ok
	zero.K = 0
	if err := checkGroups([]GemmGroup{zero}); err == nil || !strings.Contains(err.Error(), "group 0") {
		t.Errorf("K = 0: %v", err)
	}
	if err := checkGroups(nil); err == nil {
		t.Error("no groups: no error")
	}
	if GroupedGemmSupported(F32, Compute32FFast16BF) || !GroupedGemmSupported(F32, Compute32F) || !GroupedGemmSupported(BF16, 0) || GroupedGemmSupported(BF16, Compute32FFastTF32) {
		t.Error("GroupedGemmSupported disagrees with cuBLAS's table")
	}
}

// TestGPUGemmGrouped: one cublasGemmGroupedBatchedEx call over three groups
// of different shapes (transposed and not, alpha and beta per group)
// against the host reference. It needs a GPU and cuBLAS 12.5 or later.
// Built, not yet run on a GPU (tools/gpu/check.sh unverified).
func TestGPUGemmGrouped(t *testing.T) {
	d := gpu(t)
	if !d.HasGroupedGemm() {
		v, path := d.BLASVersion()
		t.Skipf("cuBLAS %d (%s) has no cublasGemmGroupedBatchedEx (12.5 or later has)", v, path)
	}
	rng := rand.New(rand.NewSource(2))
	randn := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(rng.NormFloat64())
		}
		return s
	}
	// Row-major C (m×n) = alpha·A (m×k)·B (k×n) + beta·C, each as
	// column-major C^T = B^T·A^T (B first, M and N swapped), as the tensor
	// backend issues them; the second group's B is stored n×k (TransA).
	shapes := []struct {
		m, n, k     int
		bT          bool
		alpha, beta float32
	}{{37, 53, 129, false, 1, 0}, {1, 64, 16, true, 2, 1}, {130, 24, 40, false, 0.5, -1}}
	var groups []GemmGroup
	var as, bs, cs [][]float32
	var ptrs []Ptr
	defer func() {
		for _, p := range ptrs {
			d.Free(p)
		}
	}()
	for _, s := range shapes {
		a, b, c := randn(s.m*s.k), randn(s.k*s.n), randn(s.m*s.n)
		stored := b
		ldb := s.n
		if s.bT { // store B as n×k
			stored = make([]float32, len(b))
			for l := range s.k {
				for j := range s.n {
					stored[j*s.k+l] = b[l*s.n+j]
				}
			}
			ldb = s.k
		}
		pa, pb, pc := upload(t, d, a), upload(t, d, stored), upload(t, d, c)
		ptrs = append(ptrs, pa, pb, pc)
		as, bs, cs = append(as, a), append(bs, b), append(cs, c)
		groups = append(groups, GemmGroup{TransA: s.bT, M: s.n, N: s.m, K: s.k, Alpha: s.alpha, Beta: s.beta,
			A: pb, LDA: ldb, B: pa, LDB: s.k, C: pc, LDC: s.n})
	}
	if err := d.GemmGrouped(F32, Compute32F, groups); err != nil {
		t.Fatal(err)
	}
	for gi, s := range shapes {
		got := download(t, d, groups[gi].C, s.m*s.n)
		want := hostGemm(as[gi], bs[gi], s.m, s.n, s.k)
		for i, w := range want {
			w = float64(s.alpha)*w + float64(s.beta)*float64(cs[gi][i])
			if g := float64(got[i]); math.Abs(g-w) > 1e-4*(1+math.Abs(w)) {
				t.Fatalf("group %d [%d] = %g, want %g", gi, i, g, w)
			}
		}
	}
	if err := d.GemmGrouped(F32, Compute32FFast16BF, groups); err == nil {
		t.Error("a compute type cuBLAS's grouped GEMM does not take was accepted")
	}
}
