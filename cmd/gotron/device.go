package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/tensor"
)

// deviceUsage is --device's help line (train, generate, serve, score).
const deviceUsage = "where the model computes: cpu; cuda or cuda:N — an NVIDIA GPU (experimental: the CUDA backend is being built, see docs/design/cuda.md); or sim — the simulated device, a development aid that proves the device seam (results identical to cpu; host copies counted and printed at the end)"

// memFractionUsage is --device-memory-fraction's help line.
const memFractionUsage = "with --device cuda: the fraction (0 < F ≤ 1) of the GPU's memory the caching allocator may reserve (0: 0.9)"

// deviceFlag adds --device to fs.
func deviceFlag(fs *flag.FlagSet) *string { return fs.String("device", "cpu", deviceUsage) }

// memFractionFlag adds --device-memory-fraction to fs.
func memFractionFlag(fs *flag.FlagSet) *float64 {
	return fs.Float64("device-memory-fraction", 0, memFractionUsage)
}

// parseDevice parses --device's value and opens the GPU it names (plain
// cuda: the GPU of this process's local rank under a launcher — torchrun's
// and gotron launch's LOCAL_RANK, Slurm's, MPI's, launch.DetectEnv —
// modulo the GPUs visible), naming the flag in its error.
func parseDevice(s string, memFraction float64) (tensor.Device, error) {
	if !(memFraction >= 0 && memFraction <= 1) {
		return tensor.CPU, fmt.Errorf("--device-memory-fraction %g: want a fraction in (0, 1], or 0 for the default", memFraction)
	}
	localRank := -1
	if e, err := launch.DetectEnv(os.Getenv); err == nil && e.Source != "default" {
		localRank = e.LocalRank
	}
	dev, err := tensor.OpenDevice(s, localRank, tensor.CUDAOptions{MemoryFraction: memFraction})
	if err != nil {
		return tensor.CPU, fmt.Errorf("--device: %w", err)
	}
	return dev, nil
}

// reportTransfers prints, for a run on the simulated device, the host
// copies made since since (the tool's measure of how much a program crosses
// the device seam); nothing on the CPU.
func reportTransfers(w io.Writer, cmd string, dev tensor.Device, since tensor.Transfers) {
	if dev != tensor.Sim {
		return
	}
	d := tensor.SimTransfers()
	fmt.Fprintf(w, "gotron %s: sim device: %d host-to-device copies (%.3f MB), %d device-to-host copies (%.3f MB)\n", cmd,
		d.FromHost-since.FromHost, float64(d.FromHostBytes-since.FromHostBytes)/1e6,
		d.ToHost-since.ToHost, float64(d.ToHostBytes-since.ToHostBytes)/1e6)
}
