package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/gotron/gotron/tensor"
)

// deviceUsage is --device's help line for generate, serve and score.
const deviceUsage = "where the model computes: cpu; cuda or cuda:N — an NVIDIA GPU (experimental: the CUDA backend is being built, see docs/design/cuda.md); or sim — the simulated device, a development aid that proves the device seam (results identical to cpu; host copies counted and printed at the end)"

// deviceFlag adds --device to fs.
func deviceFlag(fs *flag.FlagSet) *string { return fs.String("device", "cpu", deviceUsage) }

// parseDevice parses --device's value and opens the GPU it names, naming
// the flag in its error.
func parseDevice(s string) (tensor.Device, error) {
	dev, err := tensor.OpenDevice(s, tensor.CUDAOptions{})
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
