//go:build amd64

package cpu

// geluTanhFwdAVX512 is geluTanhForwardGo on n (a multiple of 16) elements,
// bit for bit (same operation order, same exp). Requires AVX-512F.
//
//go:noescape
func geluTanhFwdAVX512(out, inp *float32, n int)

// geluTanhBwdAVX512 is geluTanhBackwardGo on n (a multiple of 16) elements,
// bit for bit. Requires AVX-512F.
//
//go:noescape
func geluTanhBwdAVX512(dinp, dout, inp *float32, n int)

// ceGradAVX512 sets dx[i] = scale*(exp(x[i]-lse) - u) for i < n (a multiple of
// 16), with expSubAVX512's exp. Requires AVX-512F.
//
//go:noescape
func ceGradAVX512(dx, x *float32, n int, lse, scale, u float32)

// axpyAVX512 adds a*x[i] to y[i] for i < n (a multiple of 16). Requires
// AVX-512F.
//
//go:noescape
func axpyAVX512(y, x *float32, n int, a float32)

// axpyAVX2 adds a*x[i] to y[i] for i < n (a multiple of 8). Requires AVX.
//
//go:noescape
func axpyAVX2(y, x *float32, n int, a float32)

// geluTanhForwardVec runs the AVX-512 kernel on the longest multiple-of-16
// prefix and returns its length (0 on other ISAs).
func geluTanhForwardVec(out, inp []float32) int {
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(inp) >= 16:
		n := len(inp) &^ 15
		_, _ = out[n-1], inp[n-1]
		geluTanhFwdAVX512(&out[0], &inp[0], n)
		return n
	case isa == ISAAVX2 && len(inp) >= 8:
		n := len(inp) &^ 7
		_, _ = out[n-1], inp[n-1]
		geluTanhFwdAVX2(&out[0], &inp[0], n)
		return n
	}
	return 0
}

// geluTanhFwdAVX2 is geluTanhFwdAVX512 for AVX2+FMA3, n a multiple of 8
// (attention_amd64.s, beside the exp it inlines).
//
//go:noescape
func geluTanhFwdAVX2(out, inp *float32, n int)

// geluTanhBackwardVec is geluTanhForwardVec for the backward kernel.
func geluTanhBackwardVec(dinp, dout, inp []float32) int {
	if ActiveISA() != ISAAVX512 || len(inp) < 16 {
		return 0
	}
	n := len(inp) &^ 15
	_, _, _ = dinp[n-1], dout[n-1], inp[n-1]
	geluTanhBwdAVX512(&dinp[0], &dout[0], &inp[0], n)
	return n
}

// ceGradVec is ceGradAVX512 on the longest multiple-of-16 prefix of x; it
// returns the prefix length (0 on other ISAs).
func ceGradVec(dx, x []float32, lse, g, u float32) int {
	if ActiveISA() != ISAAVX512 || len(x) < 16 {
		return 0
	}
	n := len(x) &^ 15
	_ = dx[n-1]
	ceGradAVX512(&dx[0], &x[0], n, lse, g, u)
	return n
}

// axpyVec runs the kernel of ActiveISA on a prefix of x and returns its
// length.
func axpyVec(y, x []float32, a float32) int {
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(x) >= 16:
		n := len(x) &^ 15
		_ = y[n-1]
		axpyAVX512(&y[0], &x[0], n, a)
		return n
	case isa == ISAAVX2 && len(x) >= 8:
		n := len(x) &^ 7
		_ = y[n-1]
		axpyAVX2(&y[0], &x[0], n, a)
		return n
	}
	return 0
}

// dotF64AVX2 sets acc[l] to the fused float64 sum of a[i]·b[i] over
// i ≡ l (mod 16), i < n (a multiple of 16), i ascending. Requires AVX2
// and FMA3.
//
//go:noescape
func dotF64AVX2(a, b *float32, n int, acc *[dotLanes]float64)

// dotF64Vec runs dotF64AVX2 (on AVX2 and AVX-512 machines) on the longest
// multiple-of-16 prefix and returns its length.
func dotF64Vec(a, b []float32, acc *[dotLanes]float64) int {
	if ActiveISA() < ISAAVX2 || len(a) < dotLanes {
		return 0
	}
	n := len(a) &^ (dotLanes - 1)
	_ = b[n-1]
	dotF64AVX2(&a[0], &b[0], n, acc)
	return n
}

// geluErfFwdAVX512 sets out[i] = x*Phi(x) for i < n (a multiple of 16) in
// float32 (relative error ~1e-6; see ERF_CONSTS). Requires AVX-512F.
//
//go:noescape
func geluErfFwdAVX512(out, inp *float32, n int)

// geluErfBwdAVX512 adds dout*(Phi(x) + x*phi(x)) to dinp for i < n (a
// multiple of 16). Requires AVX-512F.
//
//go:noescape
func geluErfBwdAVX512(dinp, dout, inp *float32, n int)

// geluErfForwardVec runs the AVX-512 kernel on the longest multiple-of-16
// prefix and returns its length (0 on other ISAs).
func geluErfForwardVec(out, inp []float32) int {
	if ActiveISA() != ISAAVX512 || len(inp) < 16 {
		return 0
	}
	n := len(inp) &^ 15
	_, _ = out[n-1], inp[n-1]
	geluErfFwdAVX512(&out[0], &inp[0], n)
	return n
}

// geluErfBackwardVec is geluErfForwardVec for the backward kernel.
func geluErfBackwardVec(dinp, dout, inp []float32) int {
	if ActiveISA() != ISAAVX512 || len(inp) < 16 {
		return 0
	}
	n := len(inp) &^ 15
	_, _, _ = dinp[n-1], dout[n-1], inp[n-1]
	geluErfBwdAVX512(&dinp[0], &dout[0], &inp[0], n)
	return n
}

//go:noescape
func siluFwdAVX512(out, inp *float32, n int)

//go:noescape
func siluBwdAVX512(dinp, dout, inp *float32, n int)

//go:noescape
func swigluFwdAVX512(out, gate, up *float32, n int)

//go:noescape
func swigluBwdAVX512(dgate, dup, dout, gate, up *float32, n int)

// siluForwardVec, siluBackwardVec, swigluForwardVec and swigluBackwardVec
// run the AVX-512 kernels (bit-identical to the Go loops of act.go) on the
// longest multiple-of-16 prefix and return its length (0 on other ISAs).
func siluForwardVec(out, inp []float32) int {
	if ActiveISA() != ISAAVX512 || len(inp) < 16 {
		return 0
	}
	n := len(inp) &^ 15
	_, _ = out[n-1], inp[n-1]
	siluFwdAVX512(&out[0], &inp[0], n)
	return n
}

func siluBackwardVec(dinp, dout, inp []float32) int {
	if ActiveISA() != ISAAVX512 || len(inp) < 16 {
		return 0
	}
	n := len(inp) &^ 15
	_, _, _ = dinp[n-1], dout[n-1], inp[n-1]
	siluBwdAVX512(&dinp[0], &dout[0], &inp[0], n)
	return n
}

func swigluForwardVec(out, gate, up []float32) int {
	if ActiveISA() != ISAAVX512 || len(gate) < 16 {
		return 0
	}
	n := len(gate) &^ 15
	_, _, _ = out[n-1], gate[n-1], up[n-1]
	swigluFwdAVX512(&out[0], &gate[0], &up[0], n)
	return n
}

func swigluBackwardVec(dgate, dup, dout, gate, up []float32) int {
	if ActiveISA() != ISAAVX512 || len(gate) < 16 {
		return 0
	}
	n := len(gate) &^ 15
	_, _, _, _, _ = dgate[n-1], dup[n-1], dout[n-1], gate[n-1], up[n-1]
	swigluBwdAVX512(&dgate[0], &dup[0], &dout[0], &gate[0], &up[0], n)
	return n
}

//go:noescape
func addAVX512(out, a, b *float32, n int)

//go:noescape
func addAVX2(out, a, b *float32, n int)

//go:noescape
func lnParamGradAVX512(dw, dy, x *float32, n int, mean, rstd float32)

// addVec runs the kernel of ActiveISA on a prefix and returns its length.
func addVec(out, a, b []float32) int {
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(a) >= 16:
		n := len(a) &^ 15
		_, _ = out[n-1], b[n-1]
		addAVX512(&out[0], &a[0], &b[0], n)
		return n
	case isa == ISAAVX2 && len(a) >= 8:
		n := len(a) &^ 7
		_, _ = out[n-1], b[n-1]
		addAVX2(&out[0], &a[0], &b[0], n)
		return n
	}
	return 0
}

// lnParamGradVec runs lnParamGradAVX512 on a prefix and returns its length.
func lnParamGradVec(dw, g, x []float32, mean, rstd float32) int {
	if ActiveISA() != ISAAVX512 || len(x) < 16 {
		return 0
	}
	n := len(x) &^ 15
	_, _ = dw[n-1], g[n-1]
	lnParamGradAVX512(&dw[0], &g[0], &x[0], n, mean, rstd)
	return n
}

// dotsF64AVX2 sets out[j] = DotF64(q[:d], key j)·scale for j < n, key j
// at k + j·ldk bytes, d a multiple of 16. Requires AVX2 and FMA3.
//
//go:noescape
func dotsF64AVX2(q, k *float32, d, ldk, n int, scale float64, out *float64)

// axpysAVX2 adds w[j]·x_j[i] to y[i] for j = 0 … n-1 in order and i < d
// (a multiple of 16), row x_j at x + j·ldx bytes. Requires AVX2.
//
//go:noescape
func axpysAVX2(y, x *float32, d, ldx, n int, w *float32)

// dotsF64Vec runs dotsF64AVX2 when the ISA and d allow and reports
// whether it did.
func dotsF64Vec(out []float64, q, k []float32, ldk int, scale float64) bool {
	d := len(q)
	if ActiveISA() < ISAAVX2 || d%dotLanes != 0 {
		return false
	}
	dotsF64AVX2(&q[0], &k[0], d, ldk*4, len(out), scale, &out[0])
	return true
}

// axpysVec runs axpysAVX2 when the ISA and len(y) allow and reports
// whether it did.
func axpysVec(y, x []float32, ldx int, w []float32) bool {
	if ActiveISA() < ISAAVX2 || len(y)%16 != 0 {
		return false
	}
	axpysAVX2(&y[0], &x[0], len(y), ldx*4, len(w), &w[0])
	return true
}
