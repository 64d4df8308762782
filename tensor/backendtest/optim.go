package backendtest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gotron/gotron/tensor"
)

// listSizes are the tensor sizes of the list checks: odd sizes like a small
// layer's, the last spanning several tensor.NormBlocks, so a backend that
// chunks the lists' joint index space gets pieces that straddle tensors.
var listSizes = []int{35, 5, 11, 1, 3*tensor.NormBlock + 77}

// listValues returns host values for listSizes from seed: normal values
// scaled by 10^[-2, 1), some exact zeros, none negative when abs is set.
func listValues(seed uint64, abs bool) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 11))
	out := make([][]float32, len(listSizes))
	for i, n := range listSizes {
		x := make([]float32, n)
		for j := range x {
			v := r.NormFloat64() * math.Pow(10, r.Float64()*3-2)
			if r.IntN(17) == 0 {
				v = 0
			}
			if abs {
				v = math.Abs(v)
			}
			x[j] = float32(v)
		}
		out[i] = x
	}
	return out
}

// copies returns a deep copy of x.
func copies(x [][]float32) [][]float32 {
	out := make([][]float32, len(x))
	for i := range x {
		out[i] = append([]float32(nil), x[i]...)
	}
	return out
}

// newList returns a tensor list of x's values on dev (on the CPU, x
// itself, not copied).
func newList(dev tensor.Device, x [][]float32) *tensor.TensorList {
	ts := make([]*tensor.Tensor, len(x))
	for i := range x {
		ts[i] = onDev(dev, x[i], len(x[i]))
	}
	l, err := tensor.NewTensorList(ts...)
	if err != nil {
		panic(fmt.Sprintf("backendtest: %v", err)) // float32 and contiguous by construction
	}
	return l
}

// sameList compares list l, read back to the host, with want bit for bit.
func sameList(what string, l *tensor.TensorList, want [][]float32) error {
	for i := range want {
		if err := sameBits(fmt.Sprintf("%s: tensor %d", what, i), host(l.At(i)), want[i]); err != nil {
			return err
		}
	}
	return nil
}

// AdamWRef is one AdamW step on p, g, m, v with c, every operation rounded
// to float32 in the order tensor.AdamW documents (float32(...) around each
// product keeps the compiler from fusing a multiply-add).
func AdamWRef(p, g, m, v []float32, c tensor.AdamWCoeffs) {
	for j := range p {
		m[j] = float32(c.Beta1*m[j]) + float32(c.OneMinusBeta1*g[j])
		v[j] = float32(c.Beta2*v[j]) + float32(float32(c.OneMinusBeta2*g[j])*g[j])
		denom := float32(math.Sqrt(float64(v[j]/c.BC2))) + c.Eps
		p[j] -= float32(c.LR * (m[j]/c.BC1/denom + float32(c.WD*p[j])))
	}
}

// CheckAdamW runs three AdamW steps with per-tensor coefficients (one
// gradient infinite, so the NaN and Inf paths are covered) through be and
// through AdamWRef, which must agree bit for bit.
func CheckAdamW(be tensor.Backend) error {
	p, g, m, v := listValues(1, false), listValues(2, false), listValues(3, false), listValues(4, true)
	g[2][3] = float32(math.Inf(1))
	wp, wm, wv := copies(p), copies(m), copies(v)
	dev := be.Device()
	pl, gl, ml, vl := newList(dev, p), newList(dev, g), newList(dev, m), newList(dev, v)
	c := make([]tensor.AdamWCoeffs, len(p))
	for step := 1; step <= 3; step++ {
		for i := range c {
			b1, b2 := float32(0.9), float32(0.95)
			c[i] = tensor.AdamWCoeffs{Beta1: b1, Beta2: b2, OneMinusBeta1: 1 - b1, OneMinusBeta2: 1 - b2, Eps: 1e-8,
				BC1: float32(1 - math.Pow(float64(b1), float64(step))), BC2: float32(1 - math.Pow(float64(b2), float64(step))),
				LR: 1e-3 * float32(step), WD: 0.1 * float32(i%2)}
			AdamWRef(wp[i], g[i], wm[i], wv[i], c[i])
		}
		be.AdamW(pl, gl, ml, vl, c)
		for _, x := range []struct {
			what string
			l    *tensor.TensorList
			want [][]float32
		}{{"params", pl, wp}, {"exp_avg", ml, wm}, {"exp_avg_sq", vl, wv}} {
			if err := sameList(fmt.Sprintf("step %d: %s", step, x.what), x.l, x.want); err != nil {
				return err
			}
		}
	}
	return nil
}

// SGDRef is one SGD step on p with gradient g, momentum buffer buf (nil:
// none) and c, rounded as tensor.SGD documents.
func SGDRef(p, g, buf []float32, c tensor.SGDCoeffs) {
	for j := range p {
		d := g[j]
		if c.WD != 0 {
			d += float32(c.WD * p[j])
		}
		if buf != nil {
			if c.FirstStep {
				buf[j] = d
			} else {
				buf[j] = float32(c.Momentum*buf[j]) + float32(c.OneMinusDampening*d)
			}
			if c.Nesterov {
				d += float32(c.Momentum * buf[j])
			} else {
				d = buf[j]
			}
		}
		p[j] -= float32(c.LR * d)
	}
}

// CheckSGD runs three SGD steps with and without a momentum buffer
// (Nesterov on one tensor, dampening, weight decay on some) through be and
// through SGDRef, which must agree bit for bit.
func CheckSGD(be tensor.Backend) error {
	for _, momentum := range []bool{false, true} {
		p, g, b := listValues(5, false), listValues(6, false), listValues(7, false)
		wp, wb := copies(p), copies(b)
		dev := be.Device()
		pl, gl := newList(dev, p), newList(dev, g)
		var bl *tensor.TensorList
		if momentum {
			bl = newList(dev, b)
		}
		c := make([]tensor.SGDCoeffs, len(p))
		for step := range 3 {
			for i := range c {
				c[i] = tensor.SGDCoeffs{LR: 1e-2 * float32(step+1), WD: 0.01 * float32(i%2), Momentum: 0.9,
					OneMinusDampening: 0.75, FirstStep: step == 0, Nesterov: i == 2}
				if c[i].Nesterov {
					c[i].OneMinusDampening = 1
				}
				var buf []float32
				if momentum {
					buf = wb[i]
				}
				SGDRef(wp[i], g[i], buf, c[i])
			}
			be.SGD(pl, gl, bl, c)
			if err := sameList(fmt.Sprintf("momentum %v, step %d: params", momentum, step), pl, wp); err != nil {
				return err
			}
			if momentum {
				if err := sameList(fmt.Sprintf("step %d: momentum buffer", step), bl, wb); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// CheckScaleList scales a list in place through be and compares with x·α
// in float32, bit for bit.
func CheckScaleList(be tensor.Backend) error {
	x := listValues(8, false)
	want := copies(x)
	const alpha = float32(0.3)
	for i := range want {
		for j := range want[i] {
			want[i][j] *= alpha
		}
	}
	l := newList(be.Device(), x)
	be.ScaleList(l, alpha)
	return sameList("scaled", l, want)
}

// SumSquaresRef is Σ x² over the list x as tensor.NormBlock defines it:
// per block of NormBlock elements of the joint index space, the pieces of
// each tensor in it summed in float64 with four interleaved accumulators,
// then the blocks summed in order.
func SumSquaresRef(x [][]float32) float64 {
	var flat []struct{ t, j int } // every element's (tensor, index)
	for t := range x {
		for j := range x[t] {
			flat = append(flat, struct{ t, j int }{t, j})
		}
	}
	total := 0.0
	for lo := 0; lo < len(flat); lo += tensor.NormBlock {
		hi := min(lo+tensor.NormBlock, len(flat))
		block := 0.0
		for a := lo; a < hi; {
			b := a // the piece of tensor flat[a].t in this block
			for b < hi && flat[b].t == flat[a].t {
				b++
			}
			piece := x[flat[a].t][flat[a].j : flat[a].j+b-a]
			var s [4]float64
			k := 0
			for ; k+4 <= len(piece); k += 4 {
				for q := range 4 {
					s[q] += float64(piece[k+q]) * float64(piece[k+q])
				}
			}
			for ; k < len(piece); k++ {
				s[0] += float64(piece[k]) * float64(piece[k])
			}
			block += (s[0] + s[1]) + (s[2] + s[3])
			a = b
		}
		total += block
	}
	return total
}

// CheckSumSquares compares be.SumSquares with SumSquaresRef bit for bit,
// on the list and on an empty list.
func CheckSumSquares(be tensor.Backend) error {
	x, dev := listValues(9, false), be.Device()
	sum := func(l *tensor.TensorList) float64 {
		out := tensor.NewOn(dev, tensor.Int64, 1)
		be.SumSquares(out, l)
		return tensor.Float64Bits(tensor.ToHost(out))
	}
	if got, want := sum(newList(dev, x)), SumSquaresRef(x); math.Float64bits(got) != math.Float64bits(want) {
		return fmt.Errorf("SumSquares = %.17g, want %.17g (bit for bit)", got, want)
	}
	if got := sum(newList(dev, nil)); math.Float64bits(got) != 0 {
		return fmt.Errorf("SumSquares of an empty list = %v, want +0", got)
	}
	return nil
}

// CheckMaxAbs compares be.MaxAbs with the maximum |x| (exact in float64),
// then with a NaN placed in the last tensor (want NaN), and on an empty
// list (want 0).
func CheckMaxAbs(be tensor.Backend) error {
	x, dev := listValues(10, false), be.Device()
	want := 0.0
	for i := range x {
		for _, v := range x[i] {
			want = math.Max(want, math.Abs(float64(v)))
		}
	}
	if got := be.MaxAbs(newList(dev, x)); got != want {
		return fmt.Errorf("MaxAbs = %v, want %v", got, want)
	}
	last := x[len(x)-1]
	last[len(last)/2] = float32(math.NaN())
	if got := be.MaxAbs(newList(dev, x)); !math.IsNaN(got) {
		return fmt.Errorf("MaxAbs with a NaN = %v, want NaN", got)
	}
	if got := be.MaxAbs(newList(dev, nil)); got != 0 {
		return fmt.Errorf("MaxAbs of an empty list = %v, want 0", got)
	}
	return nil
}

// CheckNonFinite checks be.NonFinite on finite values, then with a NaN,
// +Inf or −Inf placed at the first element, past a NormBlock boundary and
// at the last element.
func CheckNonFinite(be tensor.Backend) error {
	x, dev := listValues(11, false), be.Device()
	// the result starts at 7: NonFinite writes 0 or 1 over whatever is there
	nonFinite := func(l *tensor.TensorList) (bool, error) {
		out := tensor.FromInt32([]int32{7}, 1).ToDevice(dev)
		be.NonFinite(out, l)
		switch v := tensor.ToHost(out).Int32s()[0]; v {
		case 0, 1:
			return v == 1, nil
		default:
			return false, fmt.Errorf("NonFinite wrote %d, want 0 or 1", v)
		}
	}
	if bad, err := nonFinite(newList(dev, x)); err != nil || bad {
		return fmt.Errorf("NonFinite on finite values: %v %v", bad, err)
	}
	if bad, err := nonFinite(newList(dev, nil)); err != nil || bad {
		return fmt.Errorf("NonFinite of an empty list: %v %v", bad, err)
	}
	last := x[len(x)-1]
	for _, c := range []struct {
		x []float32
		i int
		v float64
	}{{x[0], 0, math.NaN()}, {last, tensor.NormBlock + 3, math.Inf(1)}, {last, len(last) - 1, math.Inf(-1)}} {
		old := c.x[c.i]
		c.x[c.i] = float32(c.v)
		if bad, err := nonFinite(newList(dev, x)); err != nil || !bad {
			return fmt.Errorf("NonFinite missed %v at element %d of a tensor of %d (%v)", c.v, c.i, len(c.x), err)
		}
		c.x[c.i] = old
	}
	return nil
}
