package backendtest

import (
	"testing"

	"github.com/gotron/gotron/tensor"
)

// wrongMem is a backend with one memory, reduction or bookkeeping method's
// float32 result off by one ulp in its middle element: each check must
// notice.
type wrongMem struct {
	tensor.Backend
	method string
}

// nudgeIf nudges t when method is b's and t is a dense float32 tensor.
func (b wrongMem) nudgeIf(method string, t *tensor.Tensor) {
	if b.method == method && t.DType() == tensor.Float32 && t.IsContiguous() {
		nudge(t)
	}
}

func (b wrongMem) Fill(t *tensor.Tensor, v float32) {
	b.Backend.Fill(t, v)
	b.nudgeIf("Fill", t)
}

func (b wrongMem) CopyStrided(dst, src *tensor.Tensor) {
	b.Backend.CopyStrided(dst, src)
	b.nudgeIf("CopyStrided", dst)
}

func (b wrongMem) ScatterAddStrided(dst, v, g *tensor.Tensor) {
	b.Backend.ScatterAddStrided(dst, v, g)
	b.nudgeIf("ScatterAddStrided", dst)
}

func (b wrongMem) SumAll(out, x *tensor.Tensor) {
	b.Backend.SumAll(out, x)
	b.nudgeIf("SumAll", out)
}

func (b wrongMem) RowSum(out, x *tensor.Tensor) {
	b.Backend.RowSum(out, x)
	b.nudgeIf("RowSum", out)
}

func (b wrongMem) RowArgMax(out, arg, x *tensor.Tensor) {
	b.Backend.RowArgMax(out, arg, x)
	b.nudgeIf("RowArgMax", out)
}

func (b wrongMem) AddRowBroadcast(dx, g *tensor.Tensor) {
	b.Backend.AddRowBroadcast(dx, g)
	b.nudgeIf("AddRowBroadcast", dx)
}

func (b wrongMem) AddAtRowIndex(dx, arg, g *tensor.Tensor) {
	b.Backend.AddAtRowIndex(dx, arg, g)
	b.nudgeIf("AddAtRowIndex", dx)
}

func (b wrongMem) DropoutMask(mask *tensor.Tensor, p float32, rng tensor.RNGState) {
	b.Backend.DropoutMask(mask, p, rng)
	b.nudgeIf("DropoutMask", mask)
}

func (b wrongMem) LossMaskMean(out, w, den, losses, mask *tensor.Tensor) {
	b.Backend.LossMaskMean(out, w, den, losses, mask)
	b.nudgeIf("LossMaskMean", out)
}

func (b wrongMem) LossMaskScale(w, dout, den *tensor.Tensor) {
	b.Backend.LossMaskScale(w, dout, den)
	b.nudgeIf("LossMaskScale", w)
}

func (b wrongMem) Convert(dst, src *tensor.Tensor) {
	b.Backend.Convert(dst, src)
	b.nudgeIf("Convert", dst)
}

func TestMemoryChecksCatchErrors(t *testing.T) {
	for _, be := range backends {
		for method, check := range memoryChecks {
			if err := check(wrongMem{be, method}); err == nil {
				t.Errorf("%s: the check passed a %s result off by one ulp", be.Name(), method)
			}
		}
	}
}
