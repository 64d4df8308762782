package cpu

import "unsafe"

// Pure-Go micro-kernel: a 4×8 tile, one row of 8 accumulators at a time.
// It is the fallback on CPUs without AVX2 and the readable statement of
// what the generated assembly kernels compute.
const (
	mrGeneric = 4
	nrGeneric = 8
)

// kernGo computes C[0:mr, 0:8] = alpha*A·B (+ beta*C when load != 0) for a packed
// kc×mr A panel and a kc×8 B panel with rows ldb bytes apart.
func kernGo(mr, kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	as := unsafe.Slice(a, kc*mr)
	ldb /= 4
	ldc /= 4
	bs := unsafe.Slice(b, (kc-1)*ldb+nrGeneric)
	cs := unsafe.Slice(c, (mr-1)*ldc+nrGeneric)
	for i := 0; i < mr; i++ {
		var c0, c1, c2, c3, c4, c5, c6, c7 float32
		for p := 0; p < kc; p++ {
			av := as[p*mr+i]
			br := bs[p*ldb:][:nrGeneric]
			c0 += av * br[0]
			c1 += av * br[1]
			c2 += av * br[2]
			c3 += av * br[3]
			c4 += av * br[4]
			c5 += av * br[5]
			c6 += av * br[6]
			c7 += av * br[7]
		}
		row := cs[i*ldc:][:nrGeneric]
		c0, c1, c2, c3 = alpha*c0, alpha*c1, alpha*c2, alpha*c3
		c4, c5, c6, c7 = alpha*c4, alpha*c5, alpha*c6, alpha*c7
		if load != 0 {
			c0 += beta * row[0]
			c1 += beta * row[1]
			c2 += beta * row[2]
			c3 += beta * row[3]
			c4 += beta * row[4]
			c5 += beta * row[5]
			c6 += beta * row[6]
			c7 += beta * row[7]
		}
		row[0], row[1], row[2], row[3] = c0, c1, c2, c3
		row[4], row[5], row[6], row[7] = c4, c5, c6, c7
	}
}

func kernGo1(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	kernGo(1, kc, a, b, ldb, c, ldc, alpha, beta, load)
}

func kernGo2(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	kernGo(2, kc, a, b, ldb, c, ldc, alpha, beta, load)
}

func kernGo3(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	kernGo(3, kc, a, b, ldb, c, ldc, alpha, beta, load)
}

func kernGo4(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int) {
	kernGo(4, kc, a, b, ldb, c, ldc, alpha, beta, load)
}

// kernsGeneric[mr-1] is the pure-Go kernel for mr rows.
var kernsGeneric = [mrGeneric]kernFunc{kernGo1, kernGo2, kernGo3, kernGo4}

// genericKernels returns the pure-Go kernel set.
func genericKernels() kernSet {
	return kernSet{mr: mrGeneric, nr: nrGeneric, kerns: kernsGeneric[:], mc: 64, kc: 256, nc: 1024, wide: kernsWideGeneric[:]}
}
