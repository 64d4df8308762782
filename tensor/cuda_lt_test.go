package tensor

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/internal/cuda"
)

// TestCUDALtParams checks, without a GPU, the cuBLASLt calls of the CUDA
// backend's GemmBias (Linear's forward with the BIAS epilogue),
// GemmBiasGELU (LinearGELU's, GELU_AUX_BIAS) and GemmBGrad (the dW product
// with BGRADB): read by a host emulation of cublasLtMatmul's column-major
// contract (cublasHost for the product, the bias one element per row of D,
// the tanh GELU of that into D and the sum itself into Aux at AuxLD, Σ over
// K of op(B) for BGRADB), they give the CPU's Linear forward, its GELU,
// and its weight and bias gradients.
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

	// LinearGELU's forward: act = GELUTanh(x·wᵀ + b), Aux = x·wᵀ + b
	wantAct := Zeros(rows, out)
	cpuBackend{}.GELUForward(wantAct, want, true)
	pre, act := Zeros(rows, out), Zeros(rows, out)
	p, ok = cudaGELUParams(MatmulFP32, NoTrans, Trans, x, w, pre, act)
	if !ok || p.Epilogue != cuda.EpilogueGELUAuxBias || p.AuxLD != p.M || p.Beta != 0 || p.LDC != p.M {
		t.Fatalf("GELU_AUX_BIAS: %+v", p)
	}
	acc := make([]float32, rows*out)
	cublasHost(p.GemmParams, w.Float32s(), x.Float32s(), acc)
	gotPre, gotAct := make([]float32, p.AuxLD*p.N), make([]float32, rows*out)
	for j := range p.N {
		for i := range p.M {
			v := acc[i+j*p.LDC] + b.Float32s()[i]
			gotPre[i+j*p.AuxLD] = v
			gotAct[i+j*p.LDC] = float32(0.5 * float64(v) * (1 + math.Tanh(0.7978845608028654*(float64(v)+0.044715*float64(v)*float64(v)*float64(v)))))
		}
	}
	near("GELU_AUX_BIAS aux", gotPre, want.Float32s())
	near("GELU_AUX_BIAS D", gotAct, wantAct.Float32s())

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

// TestSimLtEpiloguesMatchCPU: on the simulated device LinearGELU and
// Linear take the epilogue branches (GemmBiasGELU and GemmBias in the
// forward, GemmBGrad in the float32 backward, counted) and give the CPU's
// output and gradients (of x, both weights and both biases) bit for bit;
// with them off, nothing is counted and the numbers are the same.
func TestSimLtEpiloguesMatchCPU(t *testing.T) {
	defer SetSimLtEpilogues(SetSimLtEpilogues(true))
	rng := NewRNG(4)
	mk := func(shape ...int) *Tensor {
		x := Zeros(shape...)
		rng.Normal(x.Float32s(), 0, 1)
		return x
	}
	x0, w0, b0 := mk(3, 4, 6), mk(5, 6), mk(6)
	run := func(dev Device, prec MatmulPrecision) [][]float32 {
		// x (3, 4, 6) → LinearGELU 6→5 → Linear 5→6
		x, w, b := Param("x", 3, 4, 6), Param("w", 5, 6), Param("b", 5)
		w2, b2 := Param("w2", 6, 5), Param("b2", 6)
		copy(x.Float32s(), x0.Float32s())
		copy(w.Float32s(), w0.Float32s())
		copy(b.Float32s(), b0.Float32s())
		copy(w2.Float32s(), w0.Float32s())
		copy(b2.Float32s(), b0.Float32s())
		MoveParams(dev, x, w, b, w2, b2)
		tp := NewTape()
		tp.SetMatmulPrecision(prec)
		y := tp.LinearGELU(x, w, b, GELUTanh)
		y = tp.Linear(y, w2, b2)
		if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
			t.Fatal(err)
		}
		r := [][]float32{ToHost(y).Float32s()}
		for _, p := range []*Tensor{x, w, b, w2, b2} {
			r = append(r, ToHost(p.Grad).Float32s())
		}
		return r
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
		want := run(CPU, prec)
		for _, on := range []bool{true, false} {
			SetSimLtEpilogues(on)
			before := CUDALtCounts()
			got := run(Sim, prec)
			d := CUDALtCounts().Sub(before)
			for i, what := range []string{"out", "dx", "dw", "db", "dw2", "db2"} {
				same(fmt.Sprintf("%v epilogues on=%v %s", prec, on, what), got[i], want[i])
			}
			wantCounts := LtCounts{}
			if on {
				wantCounts.Bias, wantCounts.GELU = 1, 1
				if prec == MatmulFP32 {
					wantCounts.BGrad = 2
				}
			}
			if d != wantCounts {
				t.Errorf("%v epilogues on=%v: %v, want %v", prec, on, d, wantCounts)
			}
		}
	}
}
