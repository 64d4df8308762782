package tensor

import (
	"math"
	"testing"

	"github.com/gotron/gotron/internal/cuda"
)

// TestCUDALtParams checks, without a GPU, the cuBLASLt calls of the CUDA
// backend's GemmBias (Linear's forward with the BIAS epilogue) and
// GemmBGrad (its dW product with BGRADB): read by a host emulation of
// cublasLtMatmul's column-major contract (cublasHost for the product, the
// bias one element per row of D for BIAS, Σ over K of op(B) for BGRADB),
// they give the CPU's Linear forward and its weight and bias gradients.
// bfloat16 operands keep CUDA_R_16BF A and B; the bias gradient is only
// fused for float32 products.
func TestCUDALtParams(t *testing.T) {
	rng := NewRNG(9)
	mk := func(shape ...int) *Tensor {
		x := Zeros(shape...)
		rng.Normal(x.Float32s(), 0, 1)
		return x
	}
	const rows, in, out = 6, 5, 7
	x, w, b, g := mk(rows, in), mk(out, in), mk(out), mk(rows, out)
	near := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-5*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%s: element %d is %v through the cuBLASLt parameters, %v on the CPU", name, i, got[i], want[i])
			}
		}
	}

	// forward: out = x·wᵀ + b
	want := Zeros(rows, out)
	cpuBackend{}.Gemm(MatmulFP32, NoTrans, Trans, 1, x, w, 0, want)
	cpuBackend{}.Add(want, want, b)
	p, ok := cudaLtParams(MatmulFP32, NoTrans, Trans, 1, x, w, 0, want, cuda.EpilogueBias)
	if !ok || p.Epilogue != cuda.EpilogueBias || p.Beta != 0 {
		t.Fatalf("forward: %+v", p)
	}
	got := make([]float32, rows*out)
	cublasHost(p.GemmParams, w.Float32s(), x.Float32s(), got) // A is w's storage, B is x's
	for j := range p.N {
		for i := range p.M { // BIAS: bias[row of D]; D's rows are out's columns
			got[i+j*p.LDC] += b.Float32s()[i]
		}
	}
	near("forward + BIAS", got, want.Float32s())
	pb, _ := cudaLtParams(MatmulBF16, NoTrans, Trans, 1, x.To(BFloat16), w.To(BFloat16), 0, want, cuda.EpilogueBias)
	if pb.AType != cuda.BF16 || pb.BType != cuda.BF16 || pb.CType != cuda.F32 || pb.Compute != cuda.Compute32F {
		t.Errorf("bf16 operands with BIAS: %v·%v→%v compute %d", pb.AType, pb.BType, pb.CType, pb.Compute)
	}

	// backward: dw += gᵀ·x, db = Σ_rows g
	dw0 := mk(out, in)
	wantDW := dw0.Clone()
	cpuBackend{}.Gemm(MatmulFP32, Trans, NoTrans, 1, g, x, 1, wantDW)
	wantDB := Zeros(out)
	cpuBackend{}.SumRows(wantDB, g)
	p, ok = cudaLtParams(MatmulFP32, Trans, NoTrans, 1, g, x, 1, wantDW, cuda.EpilogueBGradB)
	if !ok || p.Beta != 1 {
		t.Fatalf("dW: %+v", p)
	}
	gotDW := dw0.Clone().Float32s()
	cublasHost(p.GemmParams, x.Float32s(), g.Float32s(), gotDW) // A is x's storage, B is g's
	near("dW", gotDW, wantDW.Float32s())
	gotDB := make([]float32, p.N) // BGRADB: N elements, Σ over K of op(B)
	gs := g.Float32s()
	for j := range p.N {
		for q := range p.K {
			bi := q + j*p.LDB
			if p.TransB {
				bi = j + q*p.LDB
			}
			gotDB[j] += gs[bi]
		}
	}
	near("BGRADB", gotDB, wantDB.Float32s())

	if bgradFusable(MatmulBF16, Trans, g, wantDW, wantDB, Zeros(out)) || bgradFusable(MatmulFP32, Trans, g.To(BFloat16), wantDW, wantDB, Zeros(out)) {
		t.Error("the bias gradient fused into a bf16 product")
	}
	if !bgradFusable(MatmulFP32, Trans, g, wantDW, wantDB, Zeros(out)) || bgradFusable(MatmulFP32, NoTrans, g, wantDW, wantDB, Zeros(out)) {
		t.Error("bgradFusable: want the float32 dW product only")
	}
}

// TestSimLtEpiloguesMatchCPU: on the simulated device Linear takes the
// epilogue branches (GemmBias in the forward, GemmBGrad in the float32
// backward, counted) and gives the CPU's output and gradients bit for bit;
// with them off, the counts stay and the numbers are the same.
func TestSimLtEpiloguesMatchCPU(t *testing.T) {
	defer SetSimLtEpilogues(SetSimLtEpilogues(true))
	rng := NewRNG(4)
	mk := func(shape ...int) *Tensor {
		x := Zeros(shape...)
		rng.Normal(x.Float32s(), 0, 1)
		return x
	}
	x0, w0, b0 := mk(3, 4, 6), mk(5, 6), mk(5)
	run := func(dev Device, prec MatmulPrecision) (out, dx, dw, db []float32) {
		x, w, b := Param("x", 3, 4, 6), Param("w", 5, 6), Param("b", 5)
		copy(x.Float32s(), x0.Float32s())
		copy(w.Float32s(), w0.Float32s())
		copy(b.Float32s(), b0.Float32s())
		MoveParams(dev, x, w, b)
		tp := NewTape()
		tp.SetMatmulPrecision(prec)
		y := tp.Linear(x, w, b)
		if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
			t.Fatal(err)
		}
		return ToHost(y).Float32s(), ToHost(x.Grad).Float32s(), ToHost(w.Grad).Float32s(), ToHost(b.Grad).Float32s()
	}
	same := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %v on sim, %v on the CPU", name, i, got[i], want[i])
			}
		}
	}
	for _, prec := range []MatmulPrecision{MatmulFP32, MatmulBF16} {
		wo, wx, ww, wb := run(CPU, prec)
		for _, on := range []bool{true, false} {
			SetSimLtEpilogues(on)
			before := CUDALtCounts()
			o, dx, dw, db := run(Sim, prec)
			d := CUDALtCounts().Sub(before)
			name := prec.String()
			same(name+" out", o, wo)
			same(name+" dx", dx, wx)
			same(name+" dw", dw, ww)
			same(name+" db", db, wb)
			wantBias, wantBGrad := int64(0), int64(0)
			if on {
				wantBias = 1
				if prec == MatmulFP32 {
					wantBGrad = 1
				}
			}
			if d.Bias != wantBias || d.BGrad != wantBGrad || d.Products != 0 {
				t.Errorf("%s epilogues on=%v: %v, want %d bias and %d bias-gradient branches", name, on, d, wantBias, wantBGrad)
			}
		}
	}
}
