package tensor

// The simulated device's decoding allocations: the CPU's, on its storage,
// tagged Sim (its kernels are the CPU's through the embedded cpuBackend).

func (b simBackend) AllocCommitted(dtype DType, shape []int) *Tensor {
	return onDevice(b.cpuBackend.AllocCommitted(dtype, shape), Sim)
}

func (b simBackend) PackWeight(w *Tensor, dtype DType) *PackedWeight {
	pw := b.cpuBackend.PackWeight(w, dtype)
	pw.dev = Sim
	return pw
}
