package cuda

import (
	"errors"
	"math"
	"math/rand"
	"testing"
	"unsafe"
)

// toF16 is x (a small multiple of 1/8, exact in fp16) as IEEE half bits.
func toF16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	if x == 0 {
		return sign
	}
	exp := int((b>>23)&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16((b>>13)&0x3ff)
}

// TestGPULt runs cuBLASLt's products and epilogues against ltHost (the
// host emulation TestLtPlan checks), on operands that are small multiples
// of 1/8 (exact in bf16 and fp16, their products and sums exact in fp32):
//
//   - fp32 operands, CUBLAS_COMPUTE_32F: DEFAULT, BIAS, BGRADB and a
//     batched product with a shared A to 1e-5 relative (exact sums; fp32
//     order of accumulation only);
//   - TF32 (COMPUTE_32F_FAST_TF32) on the same values (exact in tf32's
//     10-bit mantissa) to 1e-5;
//   - bf16 and fp16 operands, fp32 C, COMPUTE_32F: DEFAULT and BIAS exact
//     to 1e-5 as well;
//   - GELU_AUX_BIAS (tanh GELU, its input stored in Aux) and DGELU,
//     DGELU_BGRAD reading it: 2e-3 relative (the GPU's tanh).
//
// An epilogue cuBLASLt has no algorithm for (ErrLtNoAlgorithm) fails the
// test too: the backend would fall back, and the GPU run should say so.
func TestGPULt(t *testing.T) {
	d := gpu(t)
	if _, _, err := d.LtVersion(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(3))
	vals := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.Intn(17)-8) / 8
		}
		return v
	}
	up := func(x []float32, typ DataType) Ptr {
		switch typ {
		case F32:
			return upload(t, d, x)
		}
		h := make([]uint16, len(x))
		for i, v := range x {
			if typ == BF16 {
				h[i] = toBF16(v)
			} else {
				h[i] = toF16(v)
			}
		}
		p, err := d.Alloc(int64(2 * len(h)))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CopyHtoD(p, unsafe.Pointer(&h[0]), int64(2*len(h))); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const rows, in, out, batch = 96, 64, 40, 3
	type tcase struct {
		name    string
		typ     DataType
		compute ComputeType
		epi     Epilogue
		batched bool
		dW      bool // the dW product (BGRADB), else the forward (or dX for DGELU)
		tol     float64
	}
	cases := []tcase{
		{"f32 default", F32, Compute32F, EpilogueDefault, false, false, 1e-5},
		{"f32 bias", F32, Compute32F, EpilogueBias, false, false, 1e-5},
		{"f32 batched shared A", F32, Compute32F, EpilogueDefault, true, false, 1e-5},
		{"f32 dW bgradb", F32, Compute32F, EpilogueBGradB, false, true, 1e-5},
		{"tf32 bias", F32, Compute32FFastTF32, EpilogueBias, false, false, 1e-5},
		{"bf16 default", BF16, Compute32F, EpilogueDefault, false, false, 1e-5},
		{"bf16 bias", BF16, Compute32F, EpilogueBias, false, false, 1e-5},
		{"bf16 dW bgradb", BF16, Compute32F, EpilogueBGradB, false, true, 1e-5},
		{"f16 bias", F16, Compute32F, EpilogueBias, false, false, 1e-5},
		{"f32 gelu aux bias", F32, Compute32F, EpilogueGELUAuxBias, false, false, 2e-3},
		{"f32 dgelu", F32, Compute32F, EpilogueDGELU, false, false, 2e-3},
		{"f32 dgelu bgrad", F32, Compute32F, EpilogueDGELUBGrad, false, false, 2e-3},
		{"bf16 gelu aux bias", BF16, Compute32F, EpilogueGELUAuxBias, false, false, 2e-3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p LtParams
			var a, b []float32
			nb := 1
			if c.batched {
				nb = batch
			}
			if c.dW {
				// column-major dWᵀ (in×out) = x (in×rows) · op(g) (g stored out×rows, T), β = 1
				a, b = vals(rows*in), vals(rows*out)
				p.GemmParams = GemmParams{TransB: true, M: in, N: out, K: rows, Alpha: 1, Beta: 1, LDA: in, LDB: out, LDC: in}
			} else if c.epi == EpilogueDGELU || c.epi == EpilogueDGELUBGrad {
				// column-major dXᵀ (in×rows) = w (in×out) · gᵀ (out×rows)
				a, b = vals(out*in), vals(rows*out)
				p.GemmParams = GemmParams{M: in, N: rows, K: out, Alpha: 1, LDA: in, LDB: out, LDC: in}
			} else {
				// column-major outᵀ (out×rows) = op(w) (w stored in×out, T) · x (in×rows)
				a, b = vals(out*in), vals(nb*rows*in)
				p.GemmParams = GemmParams{TransA: true, M: out, N: rows, K: in, Alpha: 1, LDA: in, LDB: in, LDC: out}
				if c.batched {
					p.Batch, p.StrideB, p.StrideC = nb, rows*in, rows*out
				}
			}
			p.AType, p.BType, p.CType, p.Compute, p.Epilogue = c.typ, c.typ, F32, c.compute, c.epi
			cHost := vals(nb * p.M * p.N)
			pa, pb, pc := up(a, c.typ), up(b, c.typ), upload(t, d, cHost)
			p.A, p.B, p.C = pa, pb, pc
			var bias, aux []float32
			var pbias, paux Ptr
			switch {
			case c.epi.readsBias():
				bias = vals(p.M)
				pbias = upload(t, d, bias)
			case c.epi == EpilogueBGradB:
				bias = make([]float32, p.N)
				pbias = upload(t, d, bias)
			case c.epi.writesBias():
				bias = make([]float32, p.M)
				pbias = upload(t, d, bias)
			}
			if c.epi.usesAux() {
				p.AuxLD = (p.M + 7) / 8 * 8
				aux = vals(p.AuxLD * p.N)
				for i := range aux {
					aux[i] *= 3 // GELU inputs over [-3, 3]
				}
				paux = upload(t, d, aux)
			}
			p.Bias, p.Aux = pbias, paux
			defer func() {
				for _, q := range []Ptr{pa, pb, pc, pbias, paux} {
					if q != 0 {
						d.Free(q)
					}
				}
			}()
			pl, err := p.plan()
			if err != nil {
				t.Fatal(err)
			}
			if err := d.LtMatmul(p); err != nil {
				if errors.Is(err, ErrLtNoAlgorithm) {
					t.Fatalf("%v (the backend would fall back to cuBLAS and a separate epilogue)", err)
				}
				t.Fatal(err)
			}
			got := download(t, d, pc, len(cHost))
			var gotBias, gotAux []float32
			if pbias != 0 {
				gotBias = download(t, d, pbias, len(bias))
			}
			if paux != 0 {
				gotAux = download(t, d, paux, len(aux))
			}
			if err := ltHost(pl, p.Alpha, p.Beta, a, b, cHost, bias, aux); err != nil {
				t.Fatal(err)
			}
			check := func(what string, got, want []float32) {
				t.Helper()
				for i := range want {
					if e := math.Abs(float64(got[i] - want[i])); e > c.tol*math.Max(1, math.Abs(float64(want[i]))) {
						t.Fatalf("%s[%d] = %v, want %v (tolerance %g relative)", what, i, got[i], want[i], c.tol)
					}
				}
			}
			check("D", got, cHost)
			if c.epi.writesBias() {
				check("bias gradient", gotBias, bias)
			}
			if c.epi == EpilogueGELUAux || c.epi == EpilogueGELUAuxBias {
				for j := range p.N {
					check("aux", gotAux[j*p.AuxLD:j*p.AuxLD+p.M], aux[j*p.AuxLD:j*p.AuxLD+p.M])
				}
			}
		})
	}
	if n := d.LtCached(); n < len(cases)-1 {
		t.Errorf("%d plans cached after %d different products", n, len(cases))
	}
}
