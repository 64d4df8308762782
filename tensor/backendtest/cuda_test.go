package backendtest

import (
	"fmt"
	"math"
	"os"
	"sort"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// cudaBackend opens GPU 0, skipping the test on a machine without one (CI).
func cudaBackend(t *testing.T) tensor.Backend {
	t.Helper()
	if err := tensor.OpenCUDA(0, tensor.CUDAOptions{}); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	return tensor.CUDABackend()
}

// cudaTol is the CUDA backend's float32 tolerance against the CPU, per
// element relative to max(1, |cpu|): the two sum in different orders (cuBLAS
// tiles, warp reductions), so results agree to a few ulps of the largest
// partial sums, not bit for bit. bf16 cases round operands to 8 bits of
// mantissa on both sides, but the rounding of sums in different orders then
// shows more.
//
// cudaTolAttnBF16 and cudaTolAttnFP16 bound the materialized attention with
// bf16 or fp16 products against the CPU's float32: every product's
// operands are rounded (probabilities, dS and dO too), and
// tools/gpu/attn_precision_emu.py, which emulates exactly that, finds worst
// errors of 6.2e-2 (bf16, dk) and 9.2e-3 (fp16) on these cases without
// dropout, whose 1/(1-p) scaling adds up to a third: hence about twice that.
const (
	cudaTol         = 2e-4
	cudaTolBF16     = 2e-2
	cudaTolAttnBF16 = 1.5e-1
	cudaTolAttnFP16 = 3e-2
	// cudaTolAttnTC bounds the tensor-core flash attention (bf16 q, k, v,
	// dO, P·Z and dS; float32 scores, softmax statistics and accumulators)
	// against the CPU's float32: tensor.TestAttntcEmulation, which
	// emulates that rounding block by block, finds worst errors of 9.4e-3
	// (out), 4.2e-3 (lse) and 2.4e-2 (dv) on the same shapes, and holds
	// them under bounds of which this is twice the largest.
	cudaTolAttnTC = 5e-2
)

// TestCUDAOps runs every op case forward and backward on the GPU against
// the CPU, each case its own subtest so that one GPU run reports them all.
func TestCUDAOps(t *testing.T) {
	cudaBackend(t)
	for _, c := range OpCases() {
		t.Run(c.Name, func(t *testing.T) {
			if why := c.skipOnCUDA(); why != "" {
				t.Skip(why)
			}
			want, err := runOp(c, tensor.CPU)
			if err != nil {
				t.Fatalf("cpu: %v", err)
			}
			got, err := runOp(c, tensor.CUDA)
			if err != nil {
				t.Fatalf("cuda: %v", err)
			}
			tol := cudaTol
			if c.BF16 {
				tol = cudaTolBF16
			}
			if err := closeAll("output", got.out, want.out, tol); err != nil {
				t.Error(err)
			}
			if err := closeAll("gradient", got.grads, want.grads, tol); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCUDAFusedOps runs the fused op cases on the GPU with fused.cu's
// kernels on (GOTRON_CUDA_UNVERIFIED's fusion: TestCUDAOps runs them
// through the unfused kernels unless that is set) against the CPU.
func TestCUDAFusedOps(t *testing.T) {
	cudaBackend(t)
	defer tensor.SetCUDAFusedKernels(tensor.SetCUDAFusedKernels(true))
	for _, c := range OpCases() {
		switch c.Name {
		case "bias-gelu", "bias-swiglu", "bias-dropout-add", "bias-dropout-add-layernorm", "bias-dropout-add-rmsnorm":
		default:
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			want, err := runOp(c, tensor.CPU)
			if err != nil {
				t.Fatalf("cpu: %v", err)
			}
			got, err := runOp(c, tensor.CUDA)
			if err != nil {
				t.Fatalf("cuda: %v", err)
			}
			if err := closeAll("output", got.out, want.out, cudaTol); err != nil {
				t.Error(err)
			}
			if err := closeAll("gradient", got.grads, want.grads, cudaTol); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCUDAMethods runs every method-level check on the GPU's backend.
func TestCUDAMethods(t *testing.T) {
	be := cudaBackend(t)
	checks := methodChecks()
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			err := func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panic: %v", r)
					}
				}()
				return checks[name](strict{be})
			}()
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCUDACopy: tensor.Copy between the host and the GPU, both ways, from
// contiguous tensors and from strided views (a checkpoint loaded into
// device parameters, sampled ids read back).
func TestCUDACopy(t *testing.T) {
	cudaBackend(t)
	x := make([]float32, 24)
	for i := range x {
		x[i] = float32(i) - 7.5
	}
	host := tensor.FromFloat32(x, 4, 6)
	dev := tensor.NewOn(tensor.CUDA, tensor.Float32, 24)
	tensor.Copy(dev, host)
	back := tensor.Zeros(4, 6)
	tensor.Copy(back, dev)
	if err := sameBits("host → cuda → host", back.Float32s(), x); err != nil {
		t.Fatal(err)
	}
	// A transposed view on each side (a nil tape: a view, no recording).
	tr := func(x *tensor.Tensor) *tensor.Tensor { return (*tensor.Tape)(nil).Transpose(x, 0, 1) }
	tensor.Copy(dev, tr(host))
	want := tensor.ToHost(tr(host).Contiguous()).Float32s()
	if err := sameBits("host view → cuda", tensor.ToHost(dev).Float32s(), want); err != nil {
		t.Fatal(err)
	}
	d46 := host.ToDevice(tensor.CUDA)
	got := tensor.Zeros(6, 4)
	tensor.Copy(got, tr(d46))
	if err := sameBits("cuda view → host", got.Float32s(), want); err != nil {
		t.Fatal(err)
	}
}

// TestCUDAReadBack: tensors of several dtypes (a nil entry, a strided
// view) read back together from the GPU hold the values they were given:
// one device-to-host copy under GOTRON_CUDA_UNVERIFIED=fewer-syncs (packed
// on the device), one each without it.
func TestCUDAReadBack(t *testing.T) {
	cudaBackend(t)
	l := tensor.New(tensor.Int64, 1)
	l.Int64s()[0] = int64(math.Float64bits(math.Pi))
	m := tensor.FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3).ToDevice(tensor.CUDA)
	ts := []*tensor.Tensor{tensor.FromFloat32([]float32{1.5, -2, float32(math.NaN())}, 3).ToDevice(tensor.CUDA), nil,
		tensor.FromInt32([]int32{7}, 1).ToDevice(tensor.CUDA), l.ToDevice(tensor.CUDA), (*tensor.Tape)(nil).Transpose(m, 0, 1)}
	before := tensor.CUDATransfers()
	got := tensor.ReadBack(ts...)
	d := tensor.CUDATransfers().Sub(before)
	f := got[0].Float32s()
	if got[1] != nil || f[0] != 1.5 || f[1] != -2 || !math.IsNaN(float64(f[2])) || got[2].Int32s()[0] != 7 ||
		tensor.Float64Bits(got[3]) != math.Pi {
		t.Errorf("read back %v %v %v %v", f, got[1], got[2].Int32s(), tensor.Float64Bits(got[3]))
	}
	if v := got[4].Contiguous().Float32s(); len(v) != 6 || v[0] != 1 || v[1] != 4 || v[5] != 6 {
		t.Errorf("transposed view %v, want [1 4 2 5 3 6]", v)
	}
	want := int64(4)
	if tensor.CUDAUnverified(os.Getenv, "fewer-syncs") {
		want = 1
	}
	if d.ToHost != want {
		t.Errorf("GOTRON_CUDA_UNVERIFIED=%q: %d device-to-host copies, want %d", os.Getenv("GOTRON_CUDA_UNVERIFIED"), d.ToHost, want)
	}
}
