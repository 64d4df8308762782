package backendtest

import (
	"fmt"
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
const (
	cudaTol     = 2e-4
	cudaTolBF16 = 2e-2
)

// TestCUDAOps runs every op case forward and backward on the GPU against
// the CPU, each case its own subtest so that one GPU run reports them all.
func TestCUDAOps(t *testing.T) {
	cudaBackend(t)
	for _, c := range OpCases() {
		t.Run(c.Name, func(t *testing.T) {
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
