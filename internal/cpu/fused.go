package cpu

// Fused bias-activation kernels (Megatron's bias_gelu and bias_swiglu
// fusions): the bias add of a linear layer and the activation in one pass
// over memory. Each adds the bias in float32 into a stack buffer of
// fusedChunk elements and hands the buffer to the activation's own kernels
// (vector and Go), with the same split between them as the unfused
// activation makes, so the results are the unfused chain's — Add, then the
// activation — bit for bit.

// fusedChunk is how many elements the fused kernels stage in a stack
// buffer at a time (32 KiB: in L1 with the operands' lines), a multiple of
// 16 so that the vector/Go split falls where the unfused kernels put it.
const fusedChunk = 2048

// addBiasChunk sets t[k] = y[k] + b[(start+k) mod len(b)], a row segment
// at a time through Add's vector kernel.
func addBiasChunk(t, y, b []float32, start int) {
	c := len(b)
	j := start % c
	for k := 0; k < len(y); {
		m := min(c-j, len(y)-k)
		Add(t[k:k+m], y[k:k+m], b[j:j+m])
		k += m
		j = 0
	}
}

// BiasGELUForward sets out = GELU(y + b) for y, out (n, c) and b (c): the
// tanh approximation when tanh is set (GELUTanhForward's numbers), else the
// exact form (GELUErfForward's).
func BiasGELUForward(out, y, b []float32, tanh bool) {
	parallel16(len(y), actGrain, func(lo, hi int) {
		var buf [fusedChunk]float32
		for i0 := lo; i0 < hi; i0 += fusedChunk {
			i1 := min(i0+fusedChunk, hi)
			t, o := buf[:i1-i0], out[i0:i1]
			addBiasChunk(t, y[i0:i1], b, i0)
			if tanh {
				n := geluTanhForwardVec(o, t)
				geluTanhForwardGo(o[n:], t[n:])
			} else {
				n := geluErfForwardVec(o, t)
				geluErfForwardGo(o[n:], t[n:])
			}
		}
	})
}

// BiasGELUBackward accumulates dy += dout · GELU'(y + b), the gradient of
// BiasGELUForward for y; the bias's is the sum of dy's rows (the caller's).
func BiasGELUBackward(dy, dout, y, b []float32, tanh bool) {
	parallel16(len(y), actGrain, func(lo, hi int) {
		var buf [fusedChunk]float32
		for i0 := lo; i0 < hi; i0 += fusedChunk {
			i1 := min(i0+fusedChunk, hi)
			t, dx, g := buf[:i1-i0], dy[i0:i1], dout[i0:i1]
			addBiasChunk(t, y[i0:i1], b, i0)
			if tanh {
				n := geluTanhBackwardVec(dx, g, t)
				geluTanhBackwardGo(dx[n:], g[n:], t[n:])
			} else {
				n := geluErfBackwardVec(dx, g, t)
				geluErfBackwardGo(dx[n:], g[n:], t[n:])
			}
		}
	})
}

// BiasSwiGLUForward sets out (n, f) = silu(gate + b_gate) · (up + b_up)
// for y (n, 2f) rows [gate | up] and b (2f) [b_gate | b_up]:
// SwiGLUForward of y + b.
func BiasSwiGLUForward(out, y, b []float32, n, f int) {
	Parallel(n, max(1, actGrain/(2*f+1)), func(lo, hi int) {
		var gb, ub [fusedChunk / 2]float32
		for i := lo; i < hi; i++ {
			row := y[i*2*f:][:2*f]
			for j0 := 0; j0 < f; j0 += fusedChunk / 2 {
				m := min(fusedChunk/2, f-j0)
				gate, up, o := gb[:m], ub[:m], out[i*f+j0:][:m]
				addBiasChunk(gate, row[j0:][:m], b[j0:][:m], 0)
				addBiasChunk(up, row[f+j0:][:m], b[f+j0:][:m], 0)
				k := swigluForwardVec(o, gate, up)
				swigluForwardGo(o[k:], gate[k:], up[k:])
			}
		}
	})
}

// BiasSwiGLUBackward accumulates the gradient of BiasSwiGLUForward for y
// into dy (n, 2f): SwiGLUBackward at y + b.
func BiasSwiGLUBackward(dy, dout, y, b []float32, n, f int) {
	Parallel(n, max(1, actGrain/(2*f+1)), func(lo, hi int) {
		var gb, ub [fusedChunk / 2]float32
		for i := lo; i < hi; i++ {
			row, drow := y[i*2*f:][:2*f], dy[i*2*f:][:2*f]
			for j0 := 0; j0 < f; j0 += fusedChunk / 2 {
				m := min(fusedChunk/2, f-j0)
				gate, up, g := gb[:m], ub[:m], dout[i*f+j0:][:m]
				dgate, dup := drow[j0:][:m], drow[f+j0:][:m]
				addBiasChunk(gate, row[j0:][:m], b[j0:][:m], 0)
				addBiasChunk(up, row[f+j0:][:m], b[f+j0:][:m], 0)
				k := swigluBackwardVec(dgate, dup, g, gate, up)
				swigluBackwardGo(dgate[k:], dup[k:], g[k:], gate[k:], up[k:])
			}
		}
	})
}
