package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/fp8"
)

// fp8Of is the internal/fp8 format of an FP8 DataType.
func fp8Of(t DataType) fp8.Format {
	if t == F8E5M2 {
		return fp8.E5M2
	}
	return fp8.E4M3
}

// fp8Mem is device memory for ltHostFP8: FP8 matrices and float32 scales
// by address.
type fp8Mem struct {
	codes  map[Ptr][]uint8
	scales map[Ptr]float32
}

// ltHostFP8 is ltHost for p's FP8 plan: A and B are the FP8 codes at p.A
// and p.B, decoded with the layouts' types and multiplied by the float32s
// at p.AScale and p.BScale, as cublasLtMatmul reads them (D =
// α·aScale·bScale·op(A)·op(B) + β·C). It refuses a plan that is not FP8
// or not in the TN form.
func ltHostFP8(t *testing.T, p LtParams, mem fp8Mem, c []float32) {
	t.Helper()
	pl, err := p.plan()
	if err != nil {
		t.Fatal(err)
	}
	if !pl.fp8() || !pl.B.Type.fp8() || pl.TransA != cublasOpT || pl.TransB != cublasOpN {
		t.Fatalf("not an FP8 TN plan: %+v", pl)
	}
	a, b := mem.codes[p.A], mem.codes[p.B]
	aScale, okA := mem.scales[p.AScale]
	bScale, okB := mem.scales[p.BScale]
	if a == nil || b == nil || !okA || !okB {
		t.Fatalf("A %#x, B %#x, AScale %#x or BScale %#x is no operand", p.A, p.B, p.AScale, p.BScale)
	}
	alpha, beta := p.Alpha, p.Beta
	dec := func(codes []uint8, typ DataType) []float32 {
		f := fp8Of(typ)
		v := make([]float32, len(codes))
		for i, x := range codes {
			v[i] = f.Decode(x)
		}
		return v
	}
	if err := ltHost(pl, alpha*aScale*bScale, beta, dec(a, pl.A.Type), dec(b, pl.B.Type), c, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestLtPlanFP8 checks, without a GPU, the cuBLASLt FP8 plans
// FP8RowMajor makes for a Linear layer's three products (TE's: fprop
// y = x·wᵀ on E4M3 x and w with fast accumulation; dgrad dx = g·w on E5M2
// g and the transposed E4M3 cast of w; wgrad dw = gᵀ·x accumulated into
// dw, on the transposed casts of g and x; split accumulator for both):
// the host emulation of cublasLtMatmul reading each plan gives the
// row-major product of the decoded FP8 values times the two scale
// inverses, within float32 summation (the products of FP8 values are
// exact). The FP8 rules refuse what cuBLASLt's FP8 matmul would.
func TestLtPlanFP8(t *testing.T) {
	const rows, in, out = 32, 48, 16
	seq := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((i*7+3)%23-11) * s
		}
		return v
	}
	x, w, g := seq(rows*in, 0.37), seq(out*in, 0.05), seq(rows*out, 1e-3)
	// quantize as internal/fp8 does: codes of v·scale, scale inverse 1/scale
	quant := func(v []float32, f fp8.Format, r, c int, transpose bool) ([]uint8, float32) {
		scale := fp8.TensorwiseScale(fp8.Amax(v), f)
		codes := make([]uint8, len(v))
		for i := range r {
			for j := range c {
				k := i*c + j
				if transpose {
					k = j*r + i
				}
				codes[k] = f.Encode(v[i*c+j] * scale)
			}
		}
		return codes, fp8.ScaleInv(scale)
	}
	xq, xInv := quant(x, fp8.E4M3, rows, in, false)
	xqT, _ := quant(x, fp8.E4M3, rows, in, true)
	wq, wInv := quant(w, fp8.E4M3, out, in, false)
	wqT, _ := quant(w, fp8.E4M3, out, in, true)
	gq, gInv := quant(g, fp8.E5M2, rows, out, false)
	gqT, _ := quant(g, fp8.E5M2, rows, out, true)
	// val is the row-major (r, c) element of the decoded codes of an
	// untransposed operand with c columns
	val := func(codes []uint8, f fp8.Format, cols, r, c int) float64 { return float64(f.Decode(codes[r*cols+c])) }
	near := func(name string, got []float32, want func(i int) float64) {
		t.Helper()
		for i, v := range got {
			if math.Abs(float64(v)-want(i)) > 1e-5*math.Max(1, math.Abs(want(i))) {
				t.Fatalf("%s: element %d is %v, want %v", name, i, v, want(i))
			}
		}
	}
	const xS, xTS, wS, wTS, gS, gTS, yP = 256, 512, 768, 1024, 1280, 1536, 4096
	op := func(data Ptr, typ DataType) FP8Operand {
		return FP8Operand{Data: data, Type: typ, ScaleInv: 8192 + data}
	}
	mem := fp8Mem{codes: map[Ptr][]uint8{xS: xq, xTS: xqT, wS: wq, wTS: wqT, gS: gq, gTS: gqT},
		scales: map[Ptr]float32{8192 + xS: xInv, 8192 + xTS: xInv, 8192 + wS: wInv, 8192 + wTS: wInv, 8192 + gS: gInv, 8192 + gTS: gInv}}

	// fprop
	p := FP8RowMajor(rows, out, in, op(xS, F8E4M3), op(wS, F8E4M3), yP, F32, 1, 0, true)
	pl, err := p.plan()
	if err != nil {
		t.Fatal(err)
	}
	if pl.FastAccum != 1 || pl.A.Type != F8E4M3 || pl.B.Type != F8E4M3 || pl.C.Type != F32 || pl.Compute != Compute32F {
		t.Errorf("fprop plan %+v", pl)
	}
	y := make([]float32, rows*out)
	ltHostFP8(t, p, mem, y)
	near("fprop", y, func(i int) float64 {
		r, o := i/out, i%out
		var s float64
		for q := range in {
			s += val(xq, fp8.E4M3, in, r, q) * val(wq, fp8.E4M3, in, o, q)
		}
		return s * float64(xInv*wInv)
	})

	// dgrad: P = g (E5M2), Q = wᵀ
	p = FP8RowMajor(rows, in, out, op(gS, F8E5M2), op(wTS, F8E4M3), yP, F32, 1, 0, false)
	if pl, err = p.plan(); err != nil {
		t.Fatal(err)
	}
	if pl.FastAccum != 0 || pl.A.Type != F8E4M3 || pl.B.Type != F8E5M2 {
		t.Errorf("dgrad plan %+v", pl)
	}
	dx := make([]float32, rows*in)
	ltHostFP8(t, p, mem, dx)
	near("dgrad", dx, func(i int) float64 {
		r, q := i/in, i%in
		var s float64
		for o := range out {
			s += val(gq, fp8.E5M2, out, r, o) * val(wq, fp8.E4M3, in, o, q)
		}
		return s * float64(gInv*wInv)
	})

	// wgrad, accumulated: P = gᵀ, Q = xᵀ
	dw0 := seq(out*in, 1e-2)
	p = FP8RowMajor(out, in, rows, op(gTS, F8E5M2), op(xTS, F8E4M3), yP, F32, 1, 1, false)
	if pl, err = p.plan(); err != nil {
		t.Fatal(err)
	}
	dw := append([]float32(nil), dw0...)
	ltHostFP8(t, p, mem, dw)
	near("wgrad", dw, func(i int) float64 {
		o, q := i/in, i%in
		var s float64
		for r := range rows {
			s += val(gq, fp8.E5M2, out, r, o) * val(xq, fp8.E4M3, in, r, q)
		}
		return float64(dw0[i]) + s*float64(gInv*xInv)
	})

	// bf16 output is allowed; the rules refuse the rest
	if _, err := FP8RowMajor(rows, out, in, op(xS, F8E4M3), op(wS, F8E4M3), yP, BF16, 1, 0, true).plan(); err != nil {
		t.Errorf("bf16 output: %v", err)
	}
	fprop := FP8RowMajor(rows, out, in, op(xS, F8E4M3), op(wS, F8E4M3), yP, F32, 1, 0, true)
	for _, c := range []struct {
		name string
		edit func(p *LtParams)
		want string
	}{
		{"NN", func(p *LtParams) { p.TransA = false; p.LDA = out }, "TN form"},
		{"E5M2 both", func(p *LtParams) { p.AType, p.BType = F8E5M2, F8E5M2 }, "E4M3 only"},
		{"mixed", func(p *LtParams) { p.BType = BF16 }, "two FP8 operands"},
		{"K", func(p *LtParams) { p.K, p.LDA, p.LDB = 40, 40, 40 }, "multiples of 16"},
		{"f16 out", func(p *LtParams) { p.CType = F16 }, "f32 or bf16"},
		{"tf32", func(p *LtParams) { p.Compute = Compute32FFastTF32 }, "COMPUTE_32F"},
		{"bias", func(p *LtParams) { p.Epilogue, p.Bias = EpilogueBias, 64 }, "default only"},
		{"no scale", func(p *LtParams) { p.BScale = 0 }, "need AScale and BScale"},
		{"f32 with scale", func(p *LtParams) { p.AType, p.BType = F32, F32 }, "FP8 only"},
		{"f32 with fast accum", func(p *LtParams) {
			p.AType, p.BType, p.AScale, p.BScale = F32, F32, 0, 0
		}, "FP8 only"},
		{"fp8 out", func(p *LtParams) {
			p.AType, p.BType, p.AScale, p.BScale, p.FastAccum, p.CType = F32, F32, 0, 0, false, F8E4M3
		}, "an FP8 output"},
	} {
		q := fprop
		c.edit(&q)
		if _, err := q.plan(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", c.name, err, c.want)
		}
	}
	var d Device
	if err := d.GemmStridedBatched(fprop.GemmParams); err == nil || !strings.Contains(err.Error(), "need cuBLASLt") {
		t.Errorf("GemmStridedBatched with FP8 operands: %v", err)
	}
}
