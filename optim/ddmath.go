package optim

import "math"

// The scheduler's cos and pow must round like the C library Megatron runs
// on (glibc's are correctly rounded in practice), because cos(πρ)+1 cancels:
// one ulp of cos becomes up to ~100 ulps of the learning rate near the end of
// a cosine decay. Go's math.Cos and math.Pow are accurate to about 1 ulp, not
// correctly rounded, so the two functions below evaluate in double-double
// arithmetic (~106 bits) and round once.

// dd is an unevaluated sum hi + lo with |lo| <= ulp(hi)/2.
type dd struct{ hi, lo float64 }

// twoSum returns a+b exactly as a dd.
func twoSum(a, b float64) dd {
	s := a + b
	bb := s - a
	return dd{s, (a - (s - bb)) + (b - bb)}
}

// ddAdd returns x+y.
func ddAdd(x, y dd) dd {
	s := twoSum(x.hi, y.hi)
	t := twoSum(x.lo, y.lo)
	s.lo += t.hi
	s = twoSum(s.hi, s.lo)
	s.lo += t.lo
	return twoSum(s.hi, s.lo)
}

// ddMul returns x·y.
func ddMul(x, y dd) dd {
	p := x.hi * y.hi
	e := math.FMA(x.hi, y.hi, -p)
	e += float64(x.hi*y.lo) + float64(x.lo*y.hi)
	return twoSum(p, e)
}

// ddDivF returns x/d for a small exact float64 d.
func ddDivF(x dd, d float64) dd {
	q := x.hi / d
	// remainder r = x - q·d, exact via FMA.
	r := ddAdd(x, dd{-q * d, -math.FMA(q, d, -q*d)})
	return twoSum(q, r.hi/d)
}

var (
	ddPiOver2 = dd{1.5707963267948966, 6.123233995736766e-17}
	ddLn2     = dd{0.6931471805599453, 2.3190468138462996e-17}
)

// crCos returns cos(x) correctly rounded (barring ties closer than 2⁻¹⁰⁰)
// for |x| <= 4, the range the scheduler uses (x = π·ρ, ρ ∈ [0, 1]); other
// arguments fall back to math.Cos.
func crCos(x float64) float64 {
	if !(math.Abs(x) <= 4) {
		return math.Cos(x)
	}
	// cos(x) = sin(π/2 − |x|), |π/2 − |x|| <= 2.43.
	y := ddAdd(ddPiOver2, dd{-math.Abs(x), 0})
	y2 := ddMul(y, y)
	term, sum := y, y
	for k := 1; k <= 30; k++ {
		term = ddDivF(ddMul(term, y2), -float64((2*k)*(2*k+1)))
		sum = ddAdd(sum, term)
		if math.Abs(term.hi) < 1e-40 {
			break
		}
	}
	return sum.hi + sum.lo
}

// crPowHalf returns 0.5**r correctly rounded (barring near-ties) for
// 0 <= r <= 1, the WSD exponential range; other r fall back to math.Pow.
func crPowHalf(r float64) float64 {
	if !(r >= 0 && r <= 1) {
		return math.Pow(0.5, r)
	}
	// 2^−r = e^z, z = −r·ln2 ∈ [−0.7, 0].
	z := ddMul(dd{-r, 0}, ddLn2)
	term, sum := dd{1, 0}, dd{1, 0}
	for k := 1; k <= 40; k++ {
		term = ddDivF(ddMul(term, z), float64(k))
		sum = ddAdd(sum, term)
		if math.Abs(term.hi) < 1e-40 {
			break
		}
	}
	return sum.hi + sum.lo
}
