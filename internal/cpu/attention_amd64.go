//go:build amd64

package cpu

// expSubAVX512 sets x[i] = exp(x[i]-sub) for i < n, n a multiple of 16, and
// returns their sum. Requires AVX-512F.
//
//go:noescape
func expSubAVX512(x *float32, n int, sub float32) float32

// expSubF32 replaces x[i] by exp(x[i]-sub) and returns their sum, with the
// AVX-512 (multiples of 16) or AVX2 (multiples of 8) kernel per ActiveISA.
func expSubF32(x []float32, sub float32) float32 {
	var s float32
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(x) >= 16:
		n := len(x) &^ 15
		s = expSubAVX512(&x[0], n, sub)
		x = x[n:]
	case isa == ISAAVX2 && len(x) >= 8:
		n := len(x) &^ 7
		s = expSubAVX2(&x[0], n, sub)
		x = x[n:]
	}
	return s + expSubGo(x, sub)
}

// expSumAVX512 returns Σ exp(x[i]-sub) for i < n, n a multiple of 16, without
// writing x. Requires AVX-512F.
//
//go:noescape
func expSumAVX512(x *float32, n int, sub float32) float32

// expSumF32 returns Σ exp(x[i]-sub) (float32 lanes, no writes).
func expSumF32(x []float32, sub float32) float32 {
	var s float32
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(x) >= 16:
		n := len(x) &^ 15
		s = expSumAVX512(&x[0], n, sub)
		x = x[n:]
	case isa == ISAAVX2 && len(x) >= 8:
		n := len(x) &^ 7
		s = expSumAVX2(&x[0], n, sub)
		x = x[n:]
	}
	for _, v := range x {
		s += expF32(v - sub)
	}
	return s
}

// maxAVX512 returns max(init, x[0:n]), n a multiple of 16. Requires AVX-512F.
//
//go:noescape
func maxAVX512(x *float32, n int, init float32) float32

// maxRowF32 returns max(m, x...), vectorised per ActiveISA like expSubF32.
func maxRowF32(m float32, x []float32) float32 {
	switch isa := ActiveISA(); {
	case isa == ISAAVX512 && len(x) >= 16:
		n := len(x) &^ 15
		m = maxAVX512(&x[0], n, m)
		x = x[n:]
	case isa == ISAAVX2 && len(x) >= 8:
		n := len(x) &^ 7
		m = maxAVX2(&x[0], n, m)
		x = x[n:]
	}
	return maxF32(m, x)
}

// expSubAVX2, expSumAVX2 and maxAVX2 are the AVX2+FMA3 versions of the
// kernels above, on multiples of 8.
//
//go:noescape
func expSubAVX2(x *float32, n int, sub float32) float32

//go:noescape
func expSumAVX2(x *float32, n int, sub float32) float32

//go:noescape
func maxAVX2(x *float32, n int, init float32) float32
