package tensor

// The attention output gate (SigmoidGate: x·σ(gate)) on the CUDA backend:
// elem.cu's elem_sigmoid_gate_fwd_f32 and _bwd_f32, the CPU's loop element
// by element (σ in float64, equal up to the float64 exp's last bit:
// hostcheck's TestHostSigmoidGate). Built, not yet run on a GPU, so
// gpt.Config.CheckDevice refuses --attention-output-gate with --device cuda
// unless GOTRON_CUDA_UNVERIFIED names output-gate.

// cudaSigmoidGateForward writes x·σ(gate) into out; all three are dense
// float32 of one shape on the GPU.
func cudaSigmoidGateForward(out, x, gate *Tensor) {
	be := cudaBackend{rt: cudaRT()}
	n := x.Numel()
	be.launch1D("elem_sigmoid_gate_fwd_f32", n, sigmoidGateArgs(be.ptr(out), 0, 0, be.ptr(x), be.ptr(gate), n)...)
}

// cudaSigmoidGateBackward writes dx = dout·σ(gate) and dgate =
// dout·x·σ(gate)(1-σ(gate)).
func cudaSigmoidGateBackward(dx, dgate, dout, x, gate *Tensor) {
	be := cudaBackend{rt: cudaRT()}
	n := x.Numel()
	be.launch1D("elem_sigmoid_gate_bwd_f32", n, sigmoidGateArgs(be.ptr(dx), be.ptr(dgate), be.ptr(dout), be.ptr(x), be.ptr(gate), n)...)
}

// sigmoidGateArgs are the gate kernels' arguments in their parameter order
// (TestElemGateArgsMatchPTX): the forward's (out, x, gate, n) when dgate is
// 0, else the backward's (dx, dgate, dout, x, gate, n).
func sigmoidGateArgs(out, dgate, dout, x, gate uintptr, n int) []any {
	if dgate == 0 {
		return []any{out, x, gate, int64(n)}
	}
	return []any{out, dgate, dout, x, gate, int64(n)}
}
