package tensor

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/half"
)

// TestLinearBF16 checks that a MatmulBF16 tape computes Linear's output and
// both gradients from bfloat16-rounded operands with float32 sums, that a
// recomputing (checkpointed) region inherits the setting, and that the
// result really differs from float32 arithmetic.
func TestLinearBF16(t *testing.T) {
	checkLinearPrecision(t, MatmulBF16, func(v float32) float64 { return float64(cpu.RoundBF16(v)) })
}

// TestLinearFP16 is TestLinearBF16 for MatmulFP16 (IEEE half operands).
func TestLinearFP16(t *testing.T) {
	checkLinearPrecision(t, MatmulFP16, func(v float32) float64 { return float64(half.Float16From(v).Float32()) })
	// Beyond fp16's range an operand becomes Inf, as on fp16 hardware: the
	// overflow --fp16's loss scaling detects.
	x := FromFloat32([]float32{70000, 1}, 1, 2)
	w := FromFloat32([]float32{1, 1}, 1, 2)
	tp := NewTape()
	tp.SetMatmulPrecision(MatmulFP16)
	if y := tp.Linear(x, w, nil).Float32s()[0]; !math.IsInf(float64(y), 1) {
		t.Errorf("fp16 Linear of 70000: %v, want +Inf", y)
	}
}

func checkLinearPrecision(t *testing.T, prec MatmulPrecision, r func(float32) float64) {
	const rows, in, out = 9, 37, 20
	rng := rand.New(rand.NewPCG(3, 4))
	fillRand := func(t *Tensor) *Tensor {
		for i := range t.f32 {
			t.f32[i] = rng.Float32()*2 - 1
		}
		return t
	}
	x0, w0, g0 := fillRand(Zeros(rows, in)), fillRand(Zeros(out, in)), fillRand(Zeros(rows, out))
	// float64 references on rounded operands: y = x·wᵀ, dx = g·w, dw = gᵀ·x.
	wantY, wantDX, wantDW := make([]float64, rows*out), make([]float64, rows*in), make([]float64, out*in)
	for i := range rows {
		for o := range out {
			for k := range in {
				p := r(x0.f32[i*in+k]) * r(w0.f32[o*in+k])
				wantY[i*out+o] += p
				wantDX[i*in+k] += r(g0.f32[i*out+o]) * r(w0.f32[o*in+k])
				wantDW[o*in+k] += r(g0.f32[i*out+o]) * r(x0.f32[i*in+k])
			}
		}
	}
	run := func(prec MatmulPrecision, checkpoint bool) (y, dx, dw []float32) {
		x, w := x0.Clone().SetRequiresGrad(true), w0.Clone().SetRequiresGrad(true)
		tp := NewTape()
		tp.SetMatmulPrecision(prec)
		var ys *Tensor
		if checkpoint {
			ys = tp.Checkpoint(func(tp *Tape, in []*Tensor) []*Tensor { return []*Tensor{tp.Linear(in[0], w, nil)} }, []*Tensor{x})[0]
		} else {
			ys = tp.Linear(x, w, nil)
		}
		y = append([]float32(nil), ys.Float32s()...)
		if err := tp.BackwardFrom([]*Tensor{ys}, []*Tensor{g0}); err != nil {
			t.Fatal(err)
		}
		return y, x.Grad.Float32s(), w.Grad.Float32s()
	}
	check := func(name string, got []float32, want []float64) float64 {
		worst := 0.0
		for i, v := range got {
			d := math.Abs(float64(v) - want[i])
			if d > 1e-5*(1+math.Abs(want[i])) {
				t.Fatalf("%v: %s[%d] = %v, want %v (rounded operands, fp32 sums)", prec, name, i, v, want[i])
			}
			worst = max(worst, d)
		}
		return worst
	}
	for _, ckpt := range []bool{false, true} {
		y, dx, dw := run(prec, ckpt)
		check("y", y, wantY)
		check("dx", dx, wantDX)
		check("dw", dw, wantDW)
	}
	// fp32 arithmetic lies measurably away from the bf16 reference.
	y32, _, _ := run(MatmulFP32, false)
	diff := 0.0
	for i, v := range y32 {
		diff = max(diff, math.Abs(float64(v)-wantY[i]))
	}
	if diff < 1e-3 {
		t.Errorf("fp32 Linear is within %g of the %v reference: the test cannot tell the precisions apart", diff, prec)
	}
	var nilTape *Tape
	if nilTape.MatmulPrecision() != MatmulFP32 {
		t.Error("a nil tape must multiply in fp32")
	}
}
