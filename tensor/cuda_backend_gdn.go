package tensor

// The gated delta net's ops on the CUDA backend: so far the causal
// depthwise convolution with SiLU (CausalConvSiLU), gdn.cu's kernels, each
// value the CPU's (internal/cpu's order, products and sums rounded one at a
// time, the SiLU's sigmoid in float64: equal up to the float64 exp's last
// bit, hostcheck's TestHostCausalConvSiLU). Built, not yet run on a GPU;
// the gated delta net's other ops (L2Norm, the gates, the delta rule) have
// no CUDA kernels yet, so gpt.Config.CheckDevice still refuses the model
// on --device cuda.

// cudaCausalConvSiLUForward writes silu(causal_conv(x, w)) into out, x and
// out dense (b, t, c) and w dense (c, k) on the GPU.
func cudaCausalConvSiLUForward(out, x, w *Tensor, b, t, c, k int) {
	be := cudaBackend{rt: cudaRT()}
	n := b * t * c
	be.launch1D("gdn_conv_silu_fwd_f32", n, gdnConvArgs(be.ptr(out), 0, be.ptr(x), be.ptr(w), n, 0, t, c, k)...)
}

// cudaCausalConvSiLUBackward adds the gradients of dout into dx (b, t, c)
// and dw (c, k): the gradient before SiLU first (a scratch of b·t·c), then
// dx by the transposed convolution and dw by one thread per weight.
func cudaCausalConvSiLUBackward(dx, dw, dout, x, w *Tensor, b, t, c, k int) {
	be := cudaBackend{rt: cudaRT()}
	n := b * t * c
	dpre := be.empty(Float32, n)
	defer dpre.dbuf.free()
	be.launch1D("gdn_conv_silu_dpre_f32", n, gdnConvArgs(be.ptr(dpre), be.ptr(dout), be.ptr(x), be.ptr(w), n, 0, t, c, k)...)
	be.launch1D("gdn_conv_silu_dx_f32", n, gdnConvArgs(be.ptr(dx), 0, be.ptr(dpre), be.ptr(w), n, 0, t, c, k)...)
	be.launch1D("gdn_conv_silu_dw_f32", c*k, gdnConvArgs(be.ptr(dw), 0, be.ptr(dpre), be.ptr(x), c*k, b, t, c, k)...)
}

// gdnConvArgs are gdn.cu's convolution kernels' arguments in their
// parameter order (TestGDNConvArgsMatchPTX): out, dout (the dpre pass only:
// non-zero), two inputs, the elements, b (the dw pass only: non-zero), t,
// c and k.
func gdnConvArgs(out, dout, a, bIn uintptr, n, b, t, c, k int) []any {
	args := []any{out}
	if dout != 0 {
		args = append(args, dout)
	}
	args = append(args, a, bIn, int64(n))
	if b != 0 {
		args = append(args, int32(b))
	}
	return append(args, int32(t), int32(c), int32(k))
}
