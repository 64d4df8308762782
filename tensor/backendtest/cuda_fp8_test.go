package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/tensor"
)

// FP8 products on the GPU against the CPU's emulation. Both quantize the
// same float32 tensors with the same amax, scale and cast (fp8.cu's are
// the internal/fp8 functions bit for bit: internal/cuda/kernels'
// TestFP8Host*), so the FP8 operands agree exactly, and every product of
// two FP8 values is exact in float32 (at most 4+4 significant bits): the
// results differ only in the summation order and in where the two scale
// inverses are applied. The split accumulator (dgrad, wgrad) sums in
// float32: cudaTol. The forward's fast accumulation does not promote
// partial sums to float32 at intervals, so it is held to
// cudaTolFP8Fprop, an allowance of about 2^-10 of the sum's magnitude
// not yet measured on a GPU.
const cudaTolFP8Fprop = 1e-3

// linearFP8Run runs one LinearFP8 (rows 48, 64 in, 32 out features, a
// bias) forward and backward on dev under the recipe, and returns y, dx,
// dw and db on the host.
func linearFP8Run(dev tensor.Device, r fp8.Recipe, bf16 bool) (out [4][]float32, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%v", rec)
		}
	}()
	const rows, in, outF = 48, 64, 32
	rng := tensor.NewRNG(27)
	x, w, b := tensor.Param("x", rows, in), tensor.Param("w", outF, in), tensor.Param("b", outF)
	rng.Fork("x").Normal(x.Float32s(), 0, 2)
	rng.Fork("w").Normal(w.Float32s(), 0, 0.05)
	rng.Fork("b").Normal(b.Float32s(), 0, 0.1)
	gy := tensor.New(tensor.Float32, rows, outF)
	rng.Fork("g").Normal(gy.Float32s(), 0, 1e-3)
	tensor.MoveParams(dev, x, w, b)
	tp := tensor.NewTape()
	y := tp.LinearFP8(x, w, b, tensor.NewFP8Linear(r, bf16, bf16))
	// loss = Σ y·gy: its gradient at y is gy
	l := tp.Sum(tp.Mul(y, gy.ToDevice(dev)))
	if err := tp.Backward(l); err != nil {
		return out, err
	}
	for i, t := range []*tensor.Tensor{y, x.Grad, w.Grad, b.Grad} {
		out[i] = append([]float32(nil), tensor.ToHost(t).Float32s()...)
	}
	return out, nil
}

// checkLinearFP8 compares linearFP8Run on be's device with the CPU's, per
// element relative to max(1, |cpu|) scaled by the largest |cpu| of the
// tensor (the products' magnitude): fprop within fpropTol, the rest
// within tol.
func checkLinearFP8(t *testing.T, dev tensor.Device, fpropTol, tol float64) {
	for _, c := range []struct {
		name string
		r    fp8.Recipe
		bf16 bool
	}{
		{"hybrid", fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}, false},
		{"hybrid-bf16", fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}, true},
		{"e4m3", fp8.Recipe{Kind: fp8.Tensorwise}, false},
	} {
		want, err := linearFP8Run(tensor.CPU, c.r, c.bf16)
		if err != nil {
			t.Fatal(err)
		}
		got, err := linearFP8Run(dev, c.r, c.bf16)
		if err != nil {
			t.Fatalf("%s on %v: %v", c.name, dev, err)
		}
		for i, name := range []string{"y", "dx", "dw", "db"} {
			lim := tol
			if i == 0 {
				lim = fpropTol
			}
			var scale float64
			for _, v := range want[i] {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			for j := range want[i] {
				if d := math.Abs(float64(got[i][j] - want[i][j])); d > lim*math.Max(scale, 1e-30) {
					t.Fatalf("%s %s[%d] = %v on %v, the CPU's %v (|diff| %.3g, largest |cpu| %.3g)", c.name, name, j, got[i][j], dev, want[i][j], d, scale)
				}
			}
		}
	}
}

// TestCUDALinearFP8MatchesCPU (GOTRON_CUDA_UNVERIFIED=fp8: built, not yet
// run on a GPU; needs compute capability 8.9+) checks LinearFP8 on the
// GPU — fp8.cu's quantization and cuBLASLt's FP8 matmul — against the
// CPU's emulation. It skips without a GPU.
func TestCUDALinearFP8MatchesCPU(t *testing.T) {
	cudaBackend(t)
	if !tensor.CUDAFP8() {
		t.Skip("FP8 products on the GPU are off: GOTRON_CUDA_UNVERIFIED=fp8 (and a GPU of compute capability 8.9 or newer) turns them on")
	}
	checkLinearFP8(t, tensor.CUDA, cudaTolFP8Fprop, cudaTol)
}

// TestSimLinearFP8 runs TestCUDALinearFP8MatchesCPU's check on the
// simulated device (bit for bit), so its harness is checked without a GPU.
func TestSimLinearFP8(t *testing.T) {
	checkLinearFP8(t, tensor.Sim, 0, 0)
}

// linearFP8DelayedRun runs three steps of one LinearFP8 layer (TE's
// delayed recipe: the same FP8Linear, its histories updated after each
// forward and each backward, the device's amaxes folded in first as
// gpt.FP8's update does) on dev, and returns each step's y, dx, dw and
// db and, after each step, every history's amaxes followed by its scale.
func linearFP8DelayedRun(dev tensor.Device, r fp8.Recipe) (outs [][4][]float32, hist [][]float32, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%v", rec)
		}
	}()
	const rows, in, outF = 48, 64, 32
	rng := tensor.NewRNG(31)
	x, w, b := tensor.Param("x", rows, in), tensor.Param("w", outF, in), tensor.Param("b", outF)
	rng.Fork("x").Normal(x.Float32s(), 0, 2)
	rng.Fork("w").Normal(w.Float32s(), 0, 0.05)
	rng.Fork("b").Normal(b.Float32s(), 0, 0.1)
	gy := tensor.New(tensor.Float32, rows, outF)
	rng.Fork("g").Normal(gy.Float32s(), 0, 1e-3)
	tensor.MoveParams(dev, x, w, b)
	q := tensor.NewFP8Linear(r, false, false)
	update := func(backward bool) {
		tensor.FoldFP8DeviceAmaxes([]*tensor.FP8Linear{q})
		if backward {
			q.Grad.Update(r.GradFormat(), r.Margin, r.AmaxAlgo)
			return
		}
		q.Input.Update(r.ForwardFormat(), r.Margin, r.AmaxAlgo)
		q.Weight.Update(r.ForwardFormat(), r.Margin, r.AmaxAlgo)
	}
	for step := range 3 {
		tensor.ZeroGrad([]*tensor.Tensor{x, w, b})
		tp := tensor.NewTape()
		// the input grows each step, so the delayed scales lag its amax
		y := tp.LinearFP8(tp.Scale(x, float32(1+step)), w, b, q)
		update(false)
		if err := tp.Backward(tp.Sum(tp.Mul(y, gy.ToDevice(dev)))); err != nil {
			return nil, nil, err
		}
		update(true)
		var o [4][]float32
		for i, t := range []*tensor.Tensor{y, x.Grad, w.Grad, b.Grad} {
			o[i] = append([]float32(nil), tensor.ToHost(t).Float32s()...)
		}
		outs = append(outs, o)
		var h []float32
		for _, s := range []*fp8.History{q.Input, q.Weight, q.Grad} {
			h = append(append(h, s.Amaxes()...), s.Scale())
		}
		hist = append(hist, h)
	}
	return outs, hist, nil
}

// checkLinearFP8Delayed compares linearFP8DelayedRun on dev with the
// CPU's: the histories and scales bit for bit (the amaxes are exact maxima
// and the updates run on the host from them), the products as
// checkLinearFP8's.
func checkLinearFP8Delayed(t *testing.T, dev tensor.Device, fpropTol, tol float64) {
	r := fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 4, AmaxAlgo: fp8.MaxOfHistory}
	want, wantHist, err := linearFP8DelayedRun(tensor.CPU, r)
	if err != nil {
		t.Fatal(err)
	}
	got, gotHist, err := linearFP8DelayedRun(dev, r)
	if err != nil {
		t.Fatalf("delayed on %v: %v", dev, err)
	}
	for step := range want {
		for j := range wantHist[step] {
			if math.Float32bits(gotHist[step][j]) != math.Float32bits(wantHist[step][j]) {
				t.Fatalf("step %d: history value %d (input, weight, gradient: amaxes then scale) %v on %v, the CPU's %v", step, j, gotHist[step][j], dev, wantHist[step][j])
			}
		}
		for i, name := range []string{"y", "dx", "dw", "db"} {
			lim := tol
			if i == 0 {
				lim = fpropTol
			}
			var scale float64
			for _, v := range want[step][i] {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			for j := range want[step][i] {
				if d := math.Abs(float64(got[step][i][j] - want[step][i][j])); d > lim*math.Max(scale, 1e-30) {
					t.Fatalf("step %d: %s[%d] = %v on %v, the CPU's %v", step, name, j, got[step][i][j], dev, want[step][i][j])
				}
			}
		}
	}
	if wantHist[2][len(wantHist[2])-1] == 1 {
		t.Fatal("the gradient's scale never moved from 1: the check compares nothing of the delayed recipe")
	}
}

// TestCUDALinearFP8DelayedMatchesCPU (GOTRON_CUDA_UNVERIFIED=fp8: built,
// not yet run on a GPU) checks the delayed recipe on the GPU — scales
// from the host's histories, amaxes observed on the device and folded in
// at each update — against the CPU's emulation over three steps. It skips
// without a GPU.
func TestCUDALinearFP8DelayedMatchesCPU(t *testing.T) {
	cudaBackend(t)
	if !tensor.CUDAFP8() {
		t.Skip("FP8 products on the GPU are off: GOTRON_CUDA_UNVERIFIED=fp8 (and a GPU of compute capability 8.9 or newer) turns them on")
	}
	checkLinearFP8Delayed(t, tensor.CUDA, cudaTolFP8Fprop, cudaTol)
}

// TestSimLinearFP8Delayed runs the delayed check on the simulated device
// (bit for bit), so its harness is checked without a GPU.
func TestSimLinearFP8Delayed(t *testing.T) {
	checkLinearFP8Delayed(t, tensor.Sim, 0, 0)
}

// linearFP8DecodeRun runs LinearFP8 as decoding does on dev: no gradients,
// rows that are not a multiple of 16 (a step's tokens; the GPU pads them),
// the weight quantized once and kept (CacheWeight), two steps of 5 and 3
// rows; it returns both outputs.
func linearFP8DecodeRun(dev tensor.Device, r fp8.Recipe) (out [2][]float32, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%v", rec)
		}
	}()
	const in, outF = 64, 32
	rng := tensor.NewRNG(33)
	w, b := tensor.New(tensor.Float32, outF, in), tensor.New(tensor.Float32, outF)
	rng.Fork("w").Normal(w.Float32s(), 0, 0.05)
	rng.Fork("b").Normal(b.Float32s(), 0, 0.1)
	tensor.MoveParams(dev, w, b)
	q := tensor.NewFP8Linear(r, false, false)
	q.CacheWeight = true
	for i, rows := range []int{5, 3} {
		x := tensor.New(tensor.Float32, rows, in)
		rng.Fork(fmt.Sprint("x", i)).Normal(x.Float32s(), 0, 2)
		tp := tensor.NewNoGradTape(nil)
		y := tp.LinearFP8(x.ToDevice(dev), w, b, q)
		out[i] = append([]float32(nil), tensor.ToHost(y).Float32s()...)
	}
	return out, nil
}

// checkLinearFP8Decode compares linearFP8DecodeRun on dev with the CPU's
// within tol of each output's largest value.
func checkLinearFP8Decode(t *testing.T, dev tensor.Device, tol float64) {
	r := fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}
	want, err := linearFP8DecodeRun(tensor.CPU, r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := linearFP8DecodeRun(dev, r)
	if err != nil {
		t.Fatalf("decoding on %v: %v", dev, err)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("step %d: %d outputs on %v, %d on the CPU", i, len(got[i]), dev, len(want[i]))
		}
		var scale float64
		for _, v := range want[i] {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		for j := range want[i] {
			if d := math.Abs(float64(got[i][j] - want[i][j])); d > tol*scale {
				t.Fatalf("step %d: y[%d] = %v on %v, the CPU's %v", i, j, got[i][j], dev, want[i][j])
			}
		}
	}
}

// TestCUDALinearFP8DecodeMatchesCPU (GOTRON_CUDA_UNVERIFIED=fp8: built,
// not yet run on a GPU) checks FP8 decoding's products on the GPU — rows
// padded to 16, the weight's FP8 codes kept on the device — against the
// CPU's emulation. It skips without a GPU.
func TestCUDALinearFP8DecodeMatchesCPU(t *testing.T) {
	cudaBackend(t)
	if !tensor.CUDAFP8() {
		t.Skip("FP8 products on the GPU are off: GOTRON_CUDA_UNVERIFIED=fp8 (and a GPU of compute capability 8.9 or newer) turns them on")
	}
	checkLinearFP8Decode(t, tensor.CUDA, cudaTolFP8Fprop)
}

// TestSimLinearFP8Decode runs the decoding check on the simulated device
// (bit for bit).
func TestSimLinearFP8Decode(t *testing.T) {
	checkLinearFP8Decode(t, tensor.Sim, 0)
}
