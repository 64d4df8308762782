package tensor

import (
	"time"

	"github.com/gotron/gotron/internal/cpu"
)

// Facts about, and settings of, the CPU backend that code outside this
// package needs (thread budgets, MFU denominators, warnings). They are named
// for the CPU because they are the CPU's: a device backend would add its own
// facts rather than reinterpret these.

// CPUThreads returns the number of goroutines the CPU backend's kernels split
// their work over: GOTRON_NUM_THREADS at start-up, else GOMAXPROCS, until
// SetCPUThreads changes it. It is process state, like GOMAXPROCS.
func CPUThreads() int { return cpu.Threads() }

// SetCPUThreads sets the number of goroutines the CPU backend's kernels use
// (n < 1 means 1) and returns the previous value, so that
//
//	defer tensor.SetCPUThreads(tensor.SetCPUThreads(n))
//
// scopes a change. Results of every kernel are independent of it.
func SetCPUThreads(n int) int { return cpu.SetThreads(n) }

// HasBF16Matmul reports whether the CPU backend runs MatmulBF16 products
// natively (AVX512_BF16 on the active instruction set). Without it they are
// still bfloat16-rounded, bit for bit the same, but at float32 speed.
func HasBF16Matmul() bool { return cpu.HasBF16GEMM() }

// CPUPeakFLOPs measures the float32 multiply-add rate, in FLOP/s (2 per
// multiply-add), that threads goroutines reach together in register-only
// loops of the active instruction set, run for about d: the ceiling a float32
// matmul on as many threads can approach on this machine now (it reflects
// the clock, vCPU placement and the load of other processes). It is the
// denominator of model FLOPs utilisation when no peak is given. threads < 1
// counts as 1; d is at least 1ms.
func CPUPeakFLOPs(threads int, d time.Duration) float64 {
	return cpu.FMAPeak(threads, d) * 1e9 // GFLOP/s → FLOP/s
}
