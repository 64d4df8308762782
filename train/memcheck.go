package train

import (
	"fmt"

	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/tensor"
)

// CheckMemory refuses a run that cannot fit in this machine's memory,
// before anything is allocated: a Go process that runs out of memory dies
// with a fatal error and a goroutine dump instead of an error. The estimate
// is Megatron's theoretical memory footprint (TheoreticalMemory) of the
// most loaded rank of the layout (cfg.Parallel); gotron keeps weights, gradients and activations in float32, so it
// needs at least about that much. The machine's memory is MemAvailable of
// /proc/meminfo; where that file is absent (not Linux) no check is made, nor
// for a run on a GPU.
// A config that does not validate passes: New reports its error.
func CheckMemory(cfg Config) error {
	if cfg.Device == tensor.CUDA {
		// The model lives in GPU memory, whose caching allocator refuses
		// an allocation that does not fit with an error naming it, the
		// peak and the fix: nothing to foresee in host memory.
		return nil
	}
	mem, ok := meminfo.Read()
	if !ok {
		return nil
	}
	return checkMemory(cfg, mem)
}

// checkMemory is CheckMemory against the given machine.
func checkMemory(cfg Config, mem meminfo.Info) error {
	r, err := TheoreticalMemory(cfg.memoryConfig())
	if err != nil {
		return nil
	}
	need := r.WeightAndOptimizerBytes + r.ActivationBytes
	if mem.Fits(need) {
		return nil
	}
	return fmt.Errorf("train: this run needs an estimated %s per rank (%.4g billion parameters; Megatron's theoretical memory: "+
		"weight and optimizer %.0f MB, activation %.0f MB) but this machine has %s: reduce --num-layers, --hidden-size, "+
		"--seq-length or --micro-batch-size ('gotron memory' prints the estimate)",
		meminfo.FormatBytes(need), r.TotalParams/1e9, r.WeightAndOptimizerMB(), r.ActivationMB(), mem)
}
