package cuda

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ltABI is every cublasLt.h value gotron passes: the enum values of
// blaslt.go and the sizes and offsets of the two structs cuBLASLt writes
// into gotron's memory, by their C names.
func ltABI() map[string]int64 {
	var r ltHeuristicResult
	m := map[string]int64{
		"sizeof(cublasLtMatmulAlgo_t)":                             int64(unsafe.Sizeof(ltAlgo{})),
		"sizeof(cublasLtMatmulHeuristicResult_t)":                  int64(unsafe.Sizeof(r)),
		"offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize)": int64(unsafe.Offsetof(r.workspaceSize)),
		"offsetof(cublasLtMatmulHeuristicResult_t, state)":         int64(unsafe.Offsetof(r.state)),
		"offsetof(cublasLtMatmulHeuristicResult_t, wavesCount)":    int64(unsafe.Offsetof(r.wavesCount)),
		"CUBLASLT_MATMUL_DESC_TRANSA":                              ltDescTransA,
		"CUBLASLT_MATMUL_DESC_TRANSB":                              ltDescTransB,
		"CUBLASLT_MATMUL_DESC_EPILOGUE":                            ltDescEpilogue,
		"CUBLASLT_MATMUL_DESC_BIAS_POINTER":                        ltDescBiasPointer,
		"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER":                ltDescAuxPointer,
		"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD":                     ltDescAuxLD,
		"CUBLASLT_MATMUL_DESC_A_SCALE_POINTER":                     ltDescAScale,
		"CUBLASLT_MATMUL_DESC_B_SCALE_POINTER":                     ltDescBScale,
		"CUBLASLT_MATMUL_DESC_FAST_ACCUM":                          ltDescFastAccum,
		"CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT":                       ltLayoutBatchCount,
		"CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET":              ltLayoutBatchOff,
		"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES":                 ltPrefMaxWorkspace,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES":               ltPrefAlignA,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES":               ltPrefAlignA + 1,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES":               ltPrefAlignA + 2,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES":               ltPrefAlignA + 3,
		"CUBLASLT_EPILOGUE_DEFAULT":                                int64(EpilogueDefault),
		"CUBLASLT_EPILOGUE_BIAS":                                   int64(EpilogueBias),
		"CUBLASLT_EPILOGUE_GELU":                                   int64(EpilogueGELU),
		"CUBLASLT_EPILOGUE_GELU_AUX":                               int64(EpilogueGELUAux),
		"CUBLASLT_EPILOGUE_GELU_BIAS":                              int64(EpilogueGELUBias),
		"CUBLASLT_EPILOGUE_GELU_AUX_BIAS":                          int64(EpilogueGELUAuxBias),
		"CUBLASLT_EPILOGUE_DGELU":                                  int64(EpilogueDGELU),
		"CUBLASLT_EPILOGUE_DGELU_BGRAD":                            int64(EpilogueDGELUBGrad),
		"CUBLASLT_EPILOGUE_BGRADA":                                 int64(EpilogueBGradA),
		"CUBLASLT_EPILOGUE_BGRADB":                                 int64(EpilogueBGradB),
		"CUBLAS_OP_N":                                              cublasOpN,
		"CUBLAS_OP_T":                                              cublasOpT,
		"CUBLAS_STATUS_NOT_SUPPORTED":                              15,
		"CUBLAS_COMPUTE_32F":                                       int64(Compute32F),
		"CUBLAS_COMPUTE_32F_FAST_TF32":                             int64(Compute32FFastTF32),
		"CUBLAS_COMPUTE_32F_FAST_16BF":                             int64(Compute32FFast16BF),
		"CUBLAS_COMPUTE_32F_FAST_16F":                              int64(Compute32FFast16F),
		"CUDA_R_32F":                                               int64(F32),
		"CUDA_R_16F":                                               int64(F16),
		"CUDA_R_16BF":                                              int64(BF16),
		"CUDA_R_8F_E4M3":                                           int64(F8E4M3),
		"CUDA_R_8F_E5M2":                                           int64(F8E5M2),
	}
	return m
}

// ltABIPinned is cublasLt.h's values (CUDA 11.8's header, 11.11.3; the
// same in 12.x and 13.x), written out so the test holds them without the
// header.
var ltABIPinned = map[string]int64{
	"sizeof(cublasLtMatmulAlgo_t)": 64, "sizeof(cublasLtMatmulHeuristicResult_t)": 96,
	"offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize)": 64, "offsetof(cublasLtMatmulHeuristicResult_t, state)": 72,
	"offsetof(cublasLtMatmulHeuristicResult_t, wavesCount)": 76,
	"CUBLASLT_MATMUL_DESC_TRANSA":                           3, "CUBLASLT_MATMUL_DESC_TRANSB": 4, "CUBLASLT_MATMUL_DESC_EPILOGUE": 7,
	"CUBLASLT_MATMUL_DESC_BIAS_POINTER": 8, "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER": 11, "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD": 12,
	"CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT": 5, "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET": 6,
	"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": 1, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES": 5,
	"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES": 6, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES": 7, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES": 8,
	"CUBLASLT_EPILOGUE_DEFAULT": 1, "CUBLASLT_EPILOGUE_BIAS": 4, "CUBLASLT_EPILOGUE_GELU": 32, "CUBLASLT_EPILOGUE_GELU_AUX": 160,
	"CUBLASLT_EPILOGUE_GELU_BIAS": 36, "CUBLASLT_EPILOGUE_GELU_AUX_BIAS": 164, "CUBLASLT_EPILOGUE_DGELU": 192,
	"CUBLASLT_EPILOGUE_DGELU_BGRAD": 208, "CUBLASLT_EPILOGUE_BGRADA": 256, "CUBLASLT_EPILOGUE_BGRADB": 512,
	"CUBLAS_OP_N": 0, "CUBLAS_OP_T": 1, "CUBLAS_STATUS_NOT_SUPPORTED": 15,
	"CUBLAS_COMPUTE_32F": 68, "CUBLAS_COMPUTE_32F_FAST_TF32": 77, "CUBLAS_COMPUTE_32F_FAST_16BF": 75, "CUBLAS_COMPUTE_32F_FAST_16F": 74,
	"CUDA_R_32F": 0, "CUDA_R_16F": 2, "CUDA_R_16BF": 14,
	"CUBLASLT_MATMUL_DESC_A_SCALE_POINTER": 17, "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER": 18, "CUBLASLT_MATMUL_DESC_FAST_ACCUM": 25,
	"CUDA_R_8F_E4M3": 28, "CUDA_R_8F_E5M2": 29,
}

// TestLtABI holds blaslt.go's cublasLt.h values to the pinned table, and,
// where a CUDA toolkit's cublasLt.h and a C compiler are installed (CUDA
// 11.8's here), to a C program compiled against that header: a value that
// differs from the header it is read from fails here, not as a wrong
// product on a GPU.
func TestLtABI(t *testing.T) {
	got := ltABI()
	for name, want := range ltABIPinned {
		if got[name] != want {
			t.Errorf("%s: gotron has %d, cublasLt.h %d", name, got[name], want)
		}
	}
	if len(got) != len(ltABIPinned) {
		t.Errorf("%d values checked, %d pinned", len(got), len(ltABIPinned))
	}
	header := ""
	for _, dir := range []string{os.Getenv("CUDA_HOME") + "/include", "/usr/local/cuda/include", "/usr/include"} {
		if _, err := os.Stat(filepath.Join(dir, "cublasLt.h")); err == nil && !strings.HasPrefix(dir, "/include") {
			header = dir
			break
		}
	}
	cc, err := exec.LookPath("cc")
	if header == "" || err != nil {
		t.Skipf("no cublasLt.h or no C compiler (%v): the pinned values only", err)
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <cublasLt.h>\nint main(void) {\n")
	for name := range got {
		src.WriteString("\tprintf(\"%s=%lld\\n\", \"" + name + "\", (long long)(" + name + "));\n")
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "abi.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "abi")
	if out, err := exec.Command(cc, "-I"+header, "-o", bin, filepath.Join(dir, "abi.c")).CombinedOutput(); err != nil {
		t.Fatalf("compiling against %s/cublasLt.h: %v\n%s", header, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, v, _ := strings.Cut(line, "=")
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		seen++
		if got[name] != c {
			t.Errorf("%s: gotron has %d, %s/cublasLt.h %d", name, got[name], header, c)
		}
	}
	if seen != len(got) {
		t.Errorf("the C program printed %d values, want %d", seen, len(got))
	}
}

// TestLtLibrarySearch: cuBLASLt is looked for as cuBLAS is (newest major
// first, in the toolkit directories), and a missing one is an error naming
// it and every place looked.
func TestLtLibrarySearch(t *testing.T) {
	t.Setenv("CUDA_HOME", "/opt/mycuda")
	s := cublasLtSearch()
	if s.names[0] != "libcublasLt.so.13" || s.names[len(s.names)-1] != "libcublasLt.so.11" {
		t.Errorf("cuBLASLt names %v: want 13 first, 11 last", s.names)
	}
	if !strings.Contains(strings.Join(s.dirs, " "), "/opt/mycuda/lib64") {
		t.Errorf("cuBLASLt search %v lacks CUDA_HOME's lib64", s.dirs)
	}
	empty := t.TempDir()
	s.loader, s.dirs = false, []string{empty}
	_, _, err := s.open()
	if err == nil {
		t.Fatal("found cuBLASLt in an empty directory")
	}
	for _, want := range []string{"libcublasLt.so.13 or libcublasLt.so.12 or libcublasLt.so.11", "cuBLASLt", "CUDA_HOME", empty} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// ltHost computes on host slices what cublasLtMatmul computes from the
// descriptors of pl: the shapes come from the layouts (op(A) is A's layout
// transposed under TRANSA, and so on), not from the LtParams they were
// made of, so a wrong layout, transpose or leading dimension gives wrong
// numbers or an error here. a, b, c hold the matrices at element 0 of
// batch 0; bias and aux are the epilogue's vectors (nil when unused).
func ltHost(pl ltPlan, alpha, beta float32, a, b, c, bias, aux []float32) error {
	m, k := pl.A.Rows, pl.A.Cols
	if pl.TransA == cublasOpT {
		m, k = k, m
	}
	kb, n := pl.B.Rows, pl.B.Cols
	if pl.TransB == cublasOpT {
		kb, n = n, kb
	}
	if kb != k || pl.C.Rows != m || pl.C.Cols != n {
		return errors.New("layouts do not make a product: op(A) " + strconv.Itoa(int(m)) + "x" + strconv.Itoa(int(k)) +
			", op(B) " + strconv.Itoa(int(kb)) + "x" + strconv.Itoa(int(n)) + ", C " + strconv.Itoa(int(pl.C.Rows)) + "x" + strconv.Itoa(int(pl.C.Cols)))
	}
	for _, l := range []ltLayout{pl.A, pl.B, pl.C} {
		if l.LD < int64(l.Rows) {
			return errors.New("a leading dimension below its rows")
		}
	}
	batch := max(int(pl.C.Batch), 1)
	gelu := func(x float64) float64 { return 0.5 * x * (1 + math.Tanh(0.7978845608028654*(x+0.044715*x*x*x))) }
	dgelu := func(x float64) float64 {
		t := math.Tanh(0.7978845608028654 * (x + 0.044715*x*x*x))
		return 0.5*(1+t) + 0.5*x*(1-t*t)*0.7978845608028654*(1+3*0.044715*x*x)
	}
	opA := func(o, i, q int) float64 {
		if pl.TransA == cublasOpT {
			return float64(a[o+q+i*int(pl.A.LD)])
		}
		return float64(a[o+i+q*int(pl.A.LD)])
	}
	opB := func(o, q, j int) float64 {
		if pl.TransB == cublasOpT {
			return float64(b[o+j+q*int(pl.B.LD)])
		}
		return float64(b[o+q+j*int(pl.B.LD)])
	}
	e := pl.Epilogue
	for bt := range batch {
		oa, ob, oc := bt*int(pl.A.Stride), bt*int(pl.B.Stride), bt*int(pl.C.Stride)
		for j := range int(n) {
			for i := range int(m) {
				var sum float64
				for q := range int(k) {
					sum += opA(oa, i, q) * opB(ob, q, j)
				}
				ci := oc + i + j*int(pl.C.LD)
				v := float64(alpha)*sum + float64(beta)*float64(c[ci])
				if e.readsBias() {
					v += float64(bias[i])
				}
				switch e {
				case EpilogueGELU, EpilogueGELUBias:
					v = gelu(v)
				case EpilogueGELUAux, EpilogueGELUAuxBias:
					aux[i+j*int(pl.AuxLD)] = float32(v)
					v = gelu(v)
				case EpilogueDGELU, EpilogueDGELUBGrad:
					v *= dgelu(float64(aux[i+j*int(pl.AuxLD)]))
				}
				c[ci] = float32(v)
			}
		}
		switch e {
		case EpilogueBGradB:
			for j := range int(n) {
				var s float64
				for q := range int(k) {
					s += opB(ob, q, j)
				}
				bias[j] = float32(s)
			}
		case EpilogueBGradA:
			for i := range int(m) {
				var s float64
				for q := range int(k) {
					s += opA(oa, i, q)
				}
				bias[i] = float32(s)
			}
		case EpilogueDGELUBGrad:
			for i := range int(m) {
				var s float64
				for j := range int(n) {
					s += float64(c[oc+i+j*int(pl.C.LD)])
				}
				bias[i] = float32(s)
			}
		}
	}
	return nil
}

// TestLtPlan checks, without a GPU, the descriptors LtMatmul makes for a
// Linear layer's products in row-major terms (out = x·wᵀ + b: w as A
// transposed, x as B; dW = gᵀ·x with BGRADB giving Σ_rows g; dX = g·w),
// for the tanh-GELU forward storing its input and the DGELU backward
// reading it, and for a batched product with a shared operand: the host
// emulation of cublasLtMatmul reading the plan gives the row-major
// reference. Plans that cuBLASLt would refuse or misread are errors.
func TestLtPlan(t *testing.T) {
	const rows, in, out = 5, 6, 3
	seq := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((i*7+3)%11-5) * s
		}
		return v
	}
	x, w, g, bias := seq(rows*in, 0.25), seq(out*in, 0.5), seq(rows*out, 0.125), seq(out, 1)
	near := func(name string, got []float32, want func(i int) float64) {
		t.Helper()
		for i, v := range got {
			if math.Abs(float64(v)-want(i)) > 1e-4*math.Max(1, math.Abs(want(i))) {
				t.Fatalf("%s: element %d is %v, want %v", name, i, v, want(i))
			}
		}
	}
	gelu := func(v float64) float64 { return 0.5 * v * (1 + math.Tanh(0.7978845608028654*(v+0.044715*v*v*v))) }
	fwd := func(r, o int) float64 {
		var s float64
		for q := range in {
			s += float64(x[r*in+q]) * float64(w[o*in+q])
		}
		return s + float64(bias[o])
	}
	// forward: column-major D (out×rows) = op(A)=w (A stored in×out, T) · op(B)=xᵀ (B stored in×rows)
	linear := GemmParams{TransA: true, M: out, N: rows, K: in, Alpha: 1, A: 256, LDA: in, B: 512, LDB: in, C: 768, LDC: out, AType: F32, BType: F32, CType: F32}
	p := LtParams{GemmParams: linear, Epilogue: EpilogueBias, Bias: 1024}
	pl, err := p.plan()
	if err != nil {
		t.Fatal(err)
	}
	if pl.Epilogue != EpilogueBias || pl.Compute != Compute32F || pl.Scale != F32 || pl.AuxLD != 0 || pl.Align != [4]uint32{256, 256, 256, 256} {
		t.Errorf("forward plan %+v", pl)
	}
	d := make([]float32, rows*out)
	if err := ltHost(pl, 1, 0, w, x, d, bias, nil); err != nil {
		t.Fatal(err)
	}
	near("Linear forward + BIAS", d, func(i int) float64 { return fwd(i/out, i%out) })

	// tanh GELU of the forward, its input stored in Aux (ld 8 ≥ out)
	p = LtParams{GemmParams: linear, Epilogue: EpilogueGELUAuxBias, Bias: 1024, Aux: 2048, AuxLD: 8}
	if pl, err = p.plan(); err != nil {
		t.Fatal(err)
	}
	aux := make([]float32, 8*rows)
	if err := ltHost(pl, 1, 0, w, x, d, bias, aux); err != nil {
		t.Fatal(err)
	}
	near("GELU_AUX_BIAS", d, func(i int) float64 { return gelu(fwd(i/out, i%out)) })
	for r := range rows {
		for o := range out {
			if math.Abs(float64(aux[o+r*8])-fwd(r, o)) > 1e-4 {
				t.Fatalf("GELU_AUX_BIAS: aux (%d, %d) = %v, want the pre-activation %v", o, r, aux[o+r*8], fwd(r, o))
			}
		}
	}

	// dW = gᵀ·x (row-major out×in) accumulated (β = 1): column-major
	// dWᵀ (in×out) = op(A)=x (in×rows) · op(B)=g (B stored out×rows, T);
	// BGRADB: Σ over K = rows of op(B) = db.
	dw0 := seq(out*in, 0.01)
	p = LtParams{GemmParams: GemmParams{TransB: true, M: in, N: out, K: rows, Alpha: 1, Beta: 1, A: 256, LDA: in, B: 512, LDB: out, C: 768 + 4, LDC: in,
		AType: F32, BType: F32, CType: F32}, Epilogue: EpilogueBGradB, Bias: 1024}
	if pl, err = p.plan(); err != nil {
		t.Fatal(err)
	}
	if pl.Align != [4]uint32{256, 256, 4, 4} || pl.BiasAlign != 256 || pl.AuxAlign != 0 {
		t.Errorf("alignments %v, bias %d, aux %d: want 256 256 4 4, 256, none", pl.Align, pl.BiasAlign, pl.AuxAlign)
	}
	dw, db := append([]float32(nil), dw0...), make([]float32, out)
	if err := ltHost(pl, 1, 1, x, g, dw, db, nil); err != nil {
		t.Fatal(err)
	}
	near("dW", dw, func(i int) float64 {
		o, q := i/in, i%in
		s := float64(dw0[i])
		for r := range rows {
			s += float64(g[r*out+o]) * float64(x[r*in+q])
		}
		return s
	})
	near("BGRADB", db, func(o int) float64 {
		var s float64
		for r := range rows {
			s += float64(g[r*out+o])
		}
		return s
	})

	// dX·GELU'(pre) = (g·w) ⊙ GELU'(aux): column-major dXᵀ (in×rows) =
	// op(A)=wᵀ (A stored in×out) · op(B)=gᵀ (B stored out×rows); aux in×rows, ld 8.
	pre := seq(8*rows, 0.3)
	p = LtParams{GemmParams: GemmParams{M: in, N: rows, K: out, Alpha: 1, A: 256, LDA: in, B: 512, LDB: out, C: 768, LDC: in, AType: F32, BType: F32, CType: F32},
		Epilogue: EpilogueDGELU, Aux: 2048, AuxLD: 8}
	if pl, err = p.plan(); err != nil {
		t.Fatal(err)
	}
	dx := make([]float32, rows*in)
	if err := ltHost(pl, 1, 0, w, g, dx, nil, pre); err != nil {
		t.Fatal(err)
	}
	near("DGELU", dx, func(i int) float64 {
		r, q := i/in, i%in
		var s float64
		for o := range out {
			s += float64(g[r*out+o]) * float64(w[o*in+q])
		}
		v := float64(pre[q+r*8])
		th := math.Tanh(0.7978845608028654 * (v + 0.044715*v*v*v))
		return s * (0.5*(1+th) + 0.5*v*(1-th*th)*0.7978845608028654*(1+3*0.044715*v*v))
	})

	// batched, A shared (stride 0): three x_b·wᵀ
	const nb = 3
	xb := seq(nb*rows*in, 0.2)
	bp := linear
	bp.Batch, bp.StrideA, bp.StrideB, bp.StrideC = nb, 0, rows*in, rows*out
	if pl, err = (LtParams{GemmParams: bp}).plan(); err != nil {
		t.Fatal(err)
	}
	if pl.A.Batch != nb || pl.A.Stride != 0 || pl.B.Stride != rows*in || pl.C.Batch != nb || pl.Epilogue != EpilogueDefault {
		t.Errorf("batched plan %+v", pl)
	}
	db3 := make([]float32, nb*rows*out)
	if err := ltHost(pl, 1, 0, w, xb, db3, nil, nil); err != nil {
		t.Fatal(err)
	}
	near("batched", db3, func(i int) float64 {
		bt, r, o := i/(rows*out), (i/out)%rows, i%out
		var s float64
		for q := range in {
			s += float64(xb[bt*rows*in+r*in+q]) * float64(w[o*in+q])
		}
		return s
	})

	// refusals
	for _, c := range []struct {
		p    LtParams
		want string
	}{
		{LtParams{GemmParams: linear, Epilogue: EpilogueBias}, "needs a Bias address"},
		{LtParams{GemmParams: linear, Bias: 8}, "which has no bias"},
		{LtParams{GemmParams: bp, Epilogue: EpilogueBias, Bias: 8}, "epilogues take one matrix"},
		{LtParams{GemmParams: linear, Epilogue: EpilogueGELUAux, Aux: 8, AuxLD: 4}, "AuxLD 4"},
		{LtParams{GemmParams: linear, Epilogue: EpilogueGELUAux, Aux: 8, AuxLD: 12}, "multiple of 8"},
		{LtParams{GemmParams: linear, Epilogue: EpilogueDGELU, AuxLD: 8}, "needs an Aux address"},
		{LtParams{GemmParams: linear, Aux: 8, AuxLD: 8}, "which has none"},
		{LtParams{GemmParams: linear, Epilogue: 3}, "epilogue cublasLtEpilogue(3)"},
		{LtParams{GemmParams: GemmParams{M: 2, N: 2, K: 2, A: 1, B: 1, C: 1, LDA: 1, LDB: 2, LDC: 2}}, "LDA 1 < 2"},
	} {
		if _, err := c.p.plan(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("epilogue %v: err %v, want one saying %q", c.p.Epilogue, err, c.want)
		}
	}
	// a plan whose layouts contradict each other is caught by the emulation
	bad, _ := (LtParams{GemmParams: linear}).plan()
	bad.TransA = cublasOpN
	if err := ltHost(bad, 1, 0, w, x, d, nil, nil); err == nil {
		t.Error("the emulation ran a plan with A untransposed")
	}
}

// TestLtDescriptors builds the descriptors of TestLtPlan's products (and a
// batched bf16 one) with the installed libcublasLt — descriptors are host
// objects, no GPU or handle needed; it skips where the library is not
// installed — and reads every attribute back with cuBLASLt's own
// GetAttribute functions: the plan rebuilt from what the library holds is
// the plan (so each attribute's value and size reached cuBLASLt as meant:
// a wrong size is CUBLAS_STATUS_INVALID_VALUE at the set), and the bias,
// Aux and FP8 scale addresses set as LtMatmul sets them read back; FP8
// plans (E5M2·E4M3 to bf16 with fast accumulation, E4M3·E4M3 to f32
// without) carry their types and FAST_ACCUM.
func TestLtDescriptors(t *testing.T) {
	api, err := loadLt()
	if err != nil {
		t.Skip("no cuBLASLt: ", err)
	}
	lib, err := purego.Dlopen(api.path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	var descGet, layoutGet func(obj uintptr, attr int32, buf unsafe.Pointer, size uintptr, written *uintptr) int32
	for _, f := range []struct {
		fp   any
		name string
	}{{&descGet, "cublasLtMatmulDescGetAttribute"}, {&layoutGet, "cublasLtMatrixLayoutGetAttribute"}} {
		addr, err := purego.Dlsym(lib, f.name)
		if err != nil {
			t.Fatal(err)
		}
		purego.RegisterFunc(f.fp, addr)
	}
	get := func(fn func(uintptr, int32, unsafe.Pointer, uintptr, *uintptr) int32, obj uintptr, attr int32, p unsafe.Pointer, size uintptr) {
		t.Helper()
		var n uintptr
		if r := fn(obj, attr, p, size, &n); r != 0 || n != size {
			t.Fatalf("GetAttribute(%d): status %d, %d bytes written, want %d", attr, r, n, size)
		}
	}
	const rows, in, out = 5, 6, 3
	linear := GemmParams{TransA: true, M: out, N: rows, K: in, Alpha: 1, A: 256, LDA: in, B: 512, LDB: in, C: 768, LDC: out, AType: F32, BType: F32, CType: F32}
	batched := GemmParams{M: 64, N: 32, K: 16, Alpha: 1, A: 256, LDA: 64, StrideA: 0, B: 512, LDB: 24, StrideB: 32 * 24, C: 1024, LDC: 64, StrideC: 64 * 32,
		Batch: 4, AType: BF16, BType: BF16, CType: F32, Compute: Compute32FFastTF32}
	for _, p := range []LtParams{
		{GemmParams: linear, Epilogue: EpilogueBias, Bias: 4096 + 8},
		{GemmParams: linear, Epilogue: EpilogueGELUAuxBias, Bias: 4096, Aux: 8192, AuxLD: 8},
		{GemmParams: GemmParams{TransB: true, M: in, N: out, K: rows, Alpha: 1, Beta: 1, A: 256, LDA: in, B: 512, LDB: out, C: 772, LDC: in,
			AType: F32, BType: F32, CType: F32}, Epilogue: EpilogueBGradB, Bias: 4096},
		{GemmParams: batched},
		FP8RowMajor(32, 16, 48, FP8Operand{Data: 256, Type: F8E5M2, ScaleInv: 4096}, FP8Operand{Data: 512, Type: F8E4M3, ScaleInv: 4100}, 1024, BF16, 1, 0, true),
		FP8RowMajor(32, 16, 48, FP8Operand{Data: 256, Type: F8E4M3, ScaleInv: 4096}, FP8Operand{Data: 512, Type: F8E4M3, ScaleInv: 4100}, 1024, F32, 1, 1, false),
	} {
		pl, err := p.plan()
		if err != nil {
			t.Fatal(err)
		}
		var e ltEntry
		if err := api.describe(pl, &e); err != nil {
			t.Fatalf("epilogue %v: %v", pl.Epilogue, err)
		}
		back := ltPlan{Align: pl.Align, BiasAlign: pl.BiasAlign, AuxAlign: pl.AuxAlign}
		var compute, scale int32
		get(descGet, e.desc, 0, unsafe.Pointer(&compute), 4) // CUBLASLT_MATMUL_DESC_COMPUTE_TYPE
		get(descGet, e.desc, 1, unsafe.Pointer(&scale), 4)   // CUBLASLT_MATMUL_DESC_SCALE_TYPE
		back.Compute, back.Scale = ComputeType(compute), DataType(scale)
		get(descGet, e.desc, ltDescTransA, unsafe.Pointer(&back.TransA), 4)
		get(descGet, e.desc, ltDescTransB, unsafe.Pointer(&back.TransB), 4)
		get(descGet, e.desc, ltDescEpilogue, unsafe.Pointer(&back.Epilogue), 4)
		if pl.Epilogue.usesAux() {
			get(descGet, e.desc, ltDescAuxLD, unsafe.Pointer(&back.AuxLD), 8)
		}
		get(descGet, e.desc, ltDescFastAccum, unsafe.Pointer(&back.FastAccum), 1)
		for _, m := range []struct {
			ly  uintptr
			dst *ltLayout
		}{{e.a, &back.A}, {e.b, &back.B}, {e.c, &back.C}} {
			var typ uint32
			var order int32
			get(layoutGet, m.ly, 0, unsafe.Pointer(&typ), 4)   // CUBLASLT_MATRIX_LAYOUT_TYPE
			get(layoutGet, m.ly, 1, unsafe.Pointer(&order), 4) // CUBLASLT_MATRIX_LAYOUT_ORDER
			if order != 0 {
				t.Errorf("layout order %d, want CUBLASLT_ORDER_COL", order)
			}
			m.dst.Type = DataType(typ)
			get(layoutGet, m.ly, 2, unsafe.Pointer(&m.dst.Rows), 8) // ROWS
			get(layoutGet, m.ly, 3, unsafe.Pointer(&m.dst.Cols), 8) // COLS
			get(layoutGet, m.ly, 4, unsafe.Pointer(&m.dst.LD), 8)   // LD
			var n int32
			get(layoutGet, m.ly, ltLayoutBatchCount, unsafe.Pointer(&n), 4)
			if n > 1 {
				m.dst.Batch = n
				get(layoutGet, m.ly, ltLayoutBatchOff, unsafe.Pointer(&m.dst.Stride), 8)
			}
		}
		if back != pl {
			t.Errorf("epilogue %v: cuBLASLt holds\n%+v\nwant\n%+v", pl.Epilogue, back, pl)
		}
		if err := api.setPointers(pl, &e, p); err != nil {
			t.Fatal(err)
		}
		var bias, aux uintptr
		get(descGet, e.desc, ltDescBiasPointer, unsafe.Pointer(&bias), 8)
		get(descGet, e.desc, ltDescAuxPointer, unsafe.Pointer(&aux), 8)
		if bias != uintptr(p.Bias) || aux != uintptr(p.Aux) {
			t.Errorf("epilogue %v: bias and aux pointers %#x %#x, want %#x %#x", pl.Epilogue, bias, aux, p.Bias, p.Aux)
		}
		var as, bs uintptr
		get(descGet, e.desc, ltDescAScale, unsafe.Pointer(&as), 8)
		get(descGet, e.desc, ltDescBScale, unsafe.Pointer(&bs), 8)
		if as != uintptr(p.AScale) || bs != uintptr(p.BScale) {
			t.Errorf("%v·%v: scale pointers %#x %#x, want %#x %#x", pl.A.Type, pl.B.Type, as, bs, p.AScale, p.BScale)
		}
		(&ltHandle{api: api}).freeEntry(&e)
	}
}
