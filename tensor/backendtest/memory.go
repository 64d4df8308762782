package backendtest

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// The checks of the memory, reduction and tape-bookkeeping methods (the
// Backend's last block): each compares with a plain loop bit for bit.

// noTape makes strided views (Transpose, Narrow) of device tensors without
// recording anything.
var noTape *tensor.Tape

// onDevCopy is onDev of a copy of x (on the CPU onDev wraps x itself,
// which the method would then change under its reference).
func onDevCopy(dev tensor.Device, x []float32, shape ...int) *tensor.Tensor {
	return onDev(dev, append([]float32(nil), x...), shape...)
}

// seq returns n distinct float32 values, some negative, one -0.
func seq(n int, seed uint64) []float32 {
	x := normals(n, seed, 2)
	if n > 1 {
		x[1] = float32(math.Copysign(0, -1))
	}
	return x
}

// CheckFill checks be.Fill on float32 (+0, -0, a value, into a view at an
// offset) and int32 tensors.
func CheckFill(be tensor.Backend) error {
	dev := be.Device()
	for _, v := range []float32{0, float32(math.Copysign(0, -1)), 1.5, -3} {
		x := seq(24, 1)
		t := onDevCopy(dev, x, 4, 6)
		be.Fill(t, v)
		want := make([]float32, 24)
		for i := range want {
			want[i] = v
		}
		if err := sameBits(fmt.Sprintf("fill %v", v), host(t), want); err != nil {
			return err
		}
		// Rows 1 and 2 only: a contiguous view at an offset.
		t = onDevCopy(dev, x, 4, 6)
		be.Fill(noTape.Narrow(t, 0, 1, 2), v)
		want = append([]float32(nil), x...)
		for i := 6; i < 18; i++ {
			want[i] = v
		}
		if err := sameBits(fmt.Sprintf("fill %v of rows 1..2", v), host(t), want); err != nil {
			return err
		}
	}
	for _, v := range []float32{0, 7} {
		t := idsOn(dev, []int32{1, 2, 3, 4, 5}, 5) // a fresh slice
		be.Fill(t, v)
		for i, got := range hostIDs(t) {
			if got != int32(v) {
				return fmt.Errorf("int32 fill %v: element %d = %d", v, i, got)
			}
		}
	}
	return nil
}

// CheckCopyStrided checks be.CopyStrided: dense to dense at offsets, a
// transposed float32 and int32 view into a dense tensor, and a dense
// tensor into a narrowed (strided) view, leaving the rest alone.
func CheckCopyStrided(be tensor.Backend) error {
	dev := be.Device()
	const r, c = 5, 7
	x := seq(r*c, 2)
	// Dense rows 1..3 into rows 0..2 of a (4, c) tensor.
	dst := onDevCopy(dev, seq(4*c, 3), 4, c)
	be.CopyStrided(noTape.Narrow(dst, 0, 0, 3), noTape.Narrow(onDevCopy(dev, x, r, c), 0, 1, 3))
	want := seq(4*c, 3)
	copy(want, x[c:4*c])
	if err := sameBits("dense rows", host(dst), want); err != nil {
		return err
	}
	// Transposed (c, r) view into a dense (c, r) tensor.
	dst = tensor.ZerosOn(dev, c, r)
	be.CopyStrided(dst, noTape.Transpose(onDevCopy(dev, x, r, c), 0, 1))
	want = make([]float32, r*c)
	for i := range r {
		for j := range c {
			want[j*r+i] = x[i*c+j]
		}
	}
	if err := sameBits("transpose", host(dst), want); err != nil {
		return err
	}
	ids := make([]int32, r*c)
	for i := range ids {
		ids[i] = int32(i*7 - 11)
	}
	di := tensor.NewOn(dev, tensor.Int32, c, r)
	be.CopyStrided(di, noTape.Transpose(idsOn(dev, ids, r, c), 0, 1))
	for i, got := range hostIDs(di) {
		if w := ids[i%r*c+i/r]; got != w {
			return fmt.Errorf("int32 transpose: element %d = %d, want %d", i, got, w)
		}
	}
	// Dense (r, 3) into columns 2..4 of an (r, c) tensor.
	src := seq(r*3, 4)
	dst = onDevCopy(dev, x, r, c)
	be.CopyStrided(noTape.Narrow(dst, 1, 2, 3), onDevCopy(dev, src, r, 3))
	want = append([]float32(nil), x...)
	for i := range r {
		copy(want[i*c+2:i*c+5], src[i*3:(i+1)*3])
	}
	return sameBits("into columns 2..4", host(dst), want)
}

// CheckScatterAddStrided checks be.ScatterAddStrided through a transposed
// view and a narrowed one.
func CheckScatterAddStrided(be tensor.Backend) error {
	dev := be.Device()
	const r, c = 6, 5
	d0 := seq(r*c, 5)
	base := tensor.ZerosOn(dev, r, c)
	g := seq(r*c, 6)
	dst := onDevCopy(dev, d0, r, c)
	be.ScatterAddStrided(dst, noTape.Transpose(base, 0, 1), onDevCopy(dev, g, c, r))
	want := append([]float32(nil), d0...)
	for j := range c {
		for i := range r {
			want[i*c+j] += g[j*r+i]
		}
	}
	if err := sameBits("transpose", host(dst), want); err != nil {
		return err
	}
	dst = onDevCopy(dev, d0, r, c)
	be.ScatterAddStrided(dst, noTape.Narrow(base, 1, 1, 3), onDevCopy(dev, g[:r*3], r, 3))
	want = append([]float32(nil), d0...)
	for i := range r {
		for j := range 3 {
			want[i*c+1+j] += g[i*3+j]
		}
	}
	return sameBits("columns 1..3", host(dst), want)
}

// CheckReductions checks be.SumAll (float64 in order, rounded once),
// be.RowSum (float32 in order) and be.RowArgMax (the first maximum).
//
// The sums are exact on the CPU and sim. A GPU adds in a tree order, which
// no tolerance relates to the CPU's around a cancellation (the ±1e30 of row
// 0 absorb their neighbours in order): the cuda backend's sums are checked
// on the same values with those two zeroed, to their rounding-error bounds
// (SumAll: float64 terms, float32 result, 1e-6·Σ|x|; RowSum: 33 float32
// terms in either order, 4e-6·Σ|row|). RowArgMax is exact everywhere.
func CheckReductions(be tensor.Backend) error {
	dev := be.Device()
	const n, c = 7, 33
	x := normals(n*c, 7, 1e3)
	x[5], x[9] = 1e30, -1e30
	x[2*c+3], x[2*c+8] = 9e3, 9e3 // a tie: the first wins
	xt := onDevCopy(dev, x, n, c)
	inOrder := be.Name() != "cuda"
	xs, xst := x, xt // the sums' inputs
	if !inOrder {
		xs = append([]float32(nil), x...)
		xs[5], xs[9] = 0, 0
		xst = onDevCopy(dev, xs, n, c)
	}
	var s64, abs64 float64
	for _, v := range xs {
		s64 += float64(v)
		abs64 += math.Abs(float64(v))
	}
	out := tensor.ZerosOn(dev, 1)
	be.SumAll(out, xst)
	if inOrder {
		if err := sameBits("SumAll", host(out), []float32{float32(s64)}); err != nil {
			return err
		}
	} else if got := float64(host(out)[0]); !within(got, s64, 0, 1e-6*abs64) {
		return fmt.Errorf("SumAll = %v, want %v within %g", got, float32(s64), 1e-6*abs64)
	}
	sums, sumAbs, maxs, args := make([]float32, n), make([]float64, n), make([]float32, n), make([]int32, n)
	for i := range n {
		var s float32
		for _, v := range xs[i*c : (i+1)*c] {
			s += v
			sumAbs[i] += math.Abs(float64(v))
		}
		sums[i] = s
		for j, v := range x[i*c : (i+1)*c] {
			if j == 0 || v > maxs[i] {
				maxs[i], args[i] = v, int32(j)
			}
		}
	}
	out = tensor.ZerosOn(dev, n)
	be.RowSum(out, xst)
	if inOrder {
		if err := sameBits("RowSum", host(out), sums); err != nil {
			return err
		}
	} else {
		for i, got := range host(out) {
			if !within(float64(got), float64(sums[i]), 0, 4e-6*sumAbs[i]) {
				return fmt.Errorf("RowSum: row %d = %v, want %v within %g", i, got, sums[i], 4e-6*sumAbs[i])
			}
		}
	}
	out, arg := tensor.ZerosOn(dev, n), tensor.NewOn(dev, tensor.Int32, n)
	be.RowArgMax(out, arg, xt)
	if err := sameBits("RowArgMax", host(out), maxs); err != nil {
		return err
	}
	for i, a := range hostIDs(arg) {
		if a != args[i] {
			return fmt.Errorf("RowArgMax: row %d index %d, want %d", i, a, args[i])
		}
	}
	return nil
}

// CheckRowAdds checks be.AddRowBroadcast and be.AddAtRowIndex.
func CheckRowAdds(be tensor.Backend) error {
	dev := be.Device()
	const n, c = 5, 9
	d0, g := seq(n*c, 8), seq(n, 9)
	arg := []int32{0, 8, 3, 3, 4}
	dx := onDevCopy(dev, d0, n, c)
	be.AddRowBroadcast(dx, onDevCopy(dev, g, n))
	want := append([]float32(nil), d0...)
	for i := range n {
		for j := range c {
			want[i*c+j] += g[i]
		}
	}
	if err := sameBits("AddRowBroadcast", host(dx), want); err != nil {
		return err
	}
	dx = onDevCopy(dev, d0, n, c)
	be.AddAtRowIndex(dx, idsOn(dev, arg, n), onDevCopy(dev, g, n))
	want = append([]float32(nil), d0...)
	for i := range n {
		want[i*c+int(arg[i])] += g[i]
	}
	return sameBits("AddAtRowIndex", host(dx), want)
}

// CheckDropoutMask checks be.DropoutMask against RNG.DropoutMask (the
// Philox stream) from the same state, at several rates, lengths that end
// inside a block and a stream already advanced.
func CheckDropoutMask(be tensor.Backend) error {
	dev := be.Device()
	for _, p := range []float32{0.1, 0.5, 0.9, 1} {
		for _, n := range []int{1, 6, 1031} {
			r := tensor.NewRNG(uint64(n)*31 + 5).Fork("dropout")
			r.Uint64()
			st := r.State()
			want := make([]float32, n)
			r.DropoutMask(want, p)
			mask := onDevCopy(dev, seq(n, 10), n)
			be.DropoutMask(mask, p, st)
			if err := sameBits(fmt.Sprintf("p %v, %d elements", p, n), host(mask), want); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckLossMask checks be.LossMaskMean (the weights, the mean and the
// Σ mask it leaves on the device, with no mask, a mask with zeros and an all-zero mask)
// and be.LossMaskScale.
func CheckLossMask(be tensor.Backend) error {
	dev := be.Device()
	const n = 37
	losses := normals(n, 11, 3)
	for i := range losses {
		losses[i] = float32(math.Abs(float64(losses[i])))
	}
	some := make([]float32, n)
	for i := range some {
		if i%3 != 0 {
			some[i] = 0.5 + float32(i)/7
		}
	}
	for ci, mask := range [][]float32{nil, some, make([]float32, n)} {
		w := make([]float32, n)
		var den, num float64
		for i := range w {
			w[i] = 1
			if mask != nil {
				w[i] = mask[i]
			}
			den += float64(w[i])
		}
		for i, l := range losses {
			num += float64(l) * float64(w[i])
		}
		var mean float32
		if den > 0 {
			mean = float32(num / den)
		}
		var mt *tensor.Tensor
		if mask != nil {
			mt = onDevCopy(dev, mask, n)
		}
		out, wt := onDevCopy(dev, []float32{42}, 1), tensor.ZerosOn(dev, n)
		denT := tensor.NewOn(dev, tensor.Int64, 1)
		be.LossMaskMean(out, wt, denT, onDevCopy(dev, losses, n), mt)
		if gotDen := tensor.Float64Bits(tensor.ToHost(denT)); gotDen != den {
			return fmt.Errorf("case %d: Σ mask %v, want %v", ci, gotDen, den)
		}
		if err := sameBits(fmt.Sprintf("case %d: weights", ci), host(wt), w); err != nil {
			return err
		}
		if err := sameBits(fmt.Sprintf("case %d: mean", ci), host(out), []float32{mean}); err != nil {
			return err
		}
		const g = float32(0.37)
		be.LossMaskScale(wt, onDevCopy(dev, []float32{g}, 1), denT)
		for i := range w {
			if den > 0 {
				w[i] *= g / float32(den)
			} else {
				w[i] = 0
			}
		}
		if err := sameBits(fmt.Sprintf("case %d: scaled weights", ci), host(wt), w); err != nil {
			return err
		}
	}
	return nil
}

// CheckConvert checks be.Convert: float32 to bfloat16 and float16 (round to
// nearest even, against tensor.Float32ToBFloat16 / Float32ToFloat16), back
// to float32, and int32 ↔ float32, the int32 from a transposed view made dense.
func CheckConvert(be tensor.Backend) error {
	dev := be.Device()
	const r, c = 3, 11
	x := normals(r*c, 12, 1e3)
	x[0], x[1], x[2] = 1e6, -7e4, float32(math.Copysign(0, -1))
	src := onDevCopy(dev, x, r, c)
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float16} {
		h := tensor.NewOn(dev, dt, r, c)
		be.Convert(h, src)
		want := make([]uint16, r*c)
		for i, v := range x {
			if dt == tensor.BFloat16 {
				want[i] = tensor.Float32ToBFloat16(v)
			} else {
				want[i] = tensor.Float32ToFloat16(v)
			}
		}
		got := tensor.ToHost(h).Uint16s()
		for i := range want {
			if got[i] != want[i] {
				return fmt.Errorf("float32 to %v: element %d = %#04x, want %#04x", dt, i, got[i], want[i])
			}
		}
		back := tensor.ZerosOn(dev, r, c)
		be.Convert(back, h)
		wantBack := make([]float32, r*c)
		for i, u := range want {
			if dt == tensor.BFloat16 {
				wantBack[i] = tensor.BFloat16ToFloat32(u)
			} else {
				wantBack[i] = tensor.Float16ToFloat32(u)
			}
		}
		if err := sameBits(fmt.Sprintf("%v to float32", dt), host(back), wantBack); err != nil {
			return err
		}
	}
	ids := make([]int32, r*c)
	for i := range ids {
		ids[i] = int32(i*i*977 - 5000)
	}
	asF := tensor.ZerosOn(dev, c, r)
	be.Convert(asF, noTape.Transpose(idsOn(dev, ids, r, c), 0, 1).Contiguous())
	wantF := make([]float32, r*c)
	for i := range wantF {
		wantF[i] = float32(ids[i%r*c+i/r])
	}
	if err := sameBits("int32 to float32", host(asF), wantF); err != nil {
		return err
	}
	asI := tensor.NewOn(dev, tensor.Int32, r, c)
	be.Convert(asI, src)
	for i, got := range hostIDs(asI) {
		if got != int32(x[i]) {
			return fmt.Errorf("float32 to int32: element %d = %d, want %d", i, got, int32(x[i]))
		}
	}
	return nil
}
