// Package nprand reproduces numpy's legacy random stream bit for bit:
// MT19937 seeded like numpy.random.RandomState(seed) and RandomState.shuffle.
// Megatron shuffles its document, sample and shuffle indices with this
// generator (megatron/core/datasets/gpt_dataset.py), so gotron must draw the
// same numbers to build the same indices.
//
// The stream is frozen by numpy's compatibility policy (NEP 19); Go's
// math/rand is a different generator and cannot be used.
package nprand

import "math"

const (
	n         = 624
	m         = 397
	matrixA   = 0x9908b0df
	upperMask = 0x80000000
	lowerMask = 0x7fffffff
)

// MT19937 is the Mersenne Twister state of numpy's RandomState. The zero value
// is not seeded; use New. It is not safe for concurrent use.
type MT19937 struct {
	mt  [n]uint32
	pos int
}

// New returns a generator seeded like numpy.random.RandomState(seed).
func New(seed uint32) *MT19937 {
	r := &MT19937{}
	r.mt[0] = seed
	for i := 1; i < n; i++ {
		prev := r.mt[i-1]
		r.mt[i] = 1812433253*(prev^(prev>>30)) + uint32(i)
	}
	r.pos = n
	return r
}

// twist regenerates the 624 words of state.
func (r *MT19937) twist() {
	for i := 0; i < n; i++ {
		y := (r.mt[i] & upperMask) | (r.mt[(i+1)%n] & lowerMask)
		v := r.mt[(i+m)%n] ^ (y >> 1)
		if y&1 != 0 {
			v ^= matrixA
		}
		r.mt[i] = v
	}
	r.pos = 0
}

// Uint32 returns the next tempered 32-bit output.
func (r *MT19937) Uint32() uint32 {
	if r.pos >= n {
		r.twist()
	}
	y := r.mt[r.pos]
	r.pos++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// Uint64 returns (next32 << 32) | next32, numpy's 64-bit draw.
func (r *MT19937) Uint64() uint64 {
	hi := uint64(r.Uint32())
	return hi<<32 | uint64(r.Uint32())
}

// Interval returns a uniform integer in [0, max] by numpy's masked rejection
// sampling (rk_interval / random_interval): 32-bit draws when max fits in 32
// bits, 64-bit draws otherwise.
func (r *MT19937) Interval(max uint64) uint64 {
	if max == 0 {
		return 0
	}
	mask := max
	mask |= mask >> 1
	mask |= mask >> 2
	mask |= mask >> 4
	mask |= mask >> 8
	mask |= mask >> 16
	mask |= mask >> 32
	if max <= 0xffffffff {
		m32 := uint32(mask)
		for {
			v := r.Uint32() & m32
			if uint64(v) <= max {
				return uint64(v)
			}
		}
	}
	for {
		v := r.Uint64() & mask
		if v <= max {
			return v
		}
	}
}

// Shuffle permutes x in place exactly like RandomState.shuffle on a 1-D
// array: for i = len−1 down to 1, swap x[i] with x[Interval(i)].
func Shuffle[T any](r *MT19937, x []T) {
	for i := len(x) - 1; i > 0; i-- {
		j := r.Interval(uint64(i))
		x[i], x[j] = x[j], x[i]
	}
}

// Float64 returns a uniform double in [0, 1) from two 32-bit draws, numpy's
// random_sample (genrand_res53): (a>>5)·2²⁶ + (b>>6), over 2⁵³.
func (r *MT19937) Float64() float64 {
	a, b := r.Uint32()>>5, r.Uint32()>>6
	return (float64(a)*67108864.0 + float64(b)) / 9007199254740992.0
}

// Binomial returns RandomState.binomial(n, p) for n·min(p, 1−p) ≤ 30, numpy's
// inversion algorithm (legacy_random_binomial → random_binomial_inversion),
// which every draw of Megatron's FIM data uses (n = 1). It draws at least one
// double even when p is 0 or 1, as numpy does. n must be ≥ 0 and p in
// [0, 1]; BTPE (larger n·p) is not implemented and reports ok=false.
func (r *MT19937) Binomial(n int64, p float64) (x int64, ok bool) {
	if n < 0 || !(p >= 0 && p <= 1) {
		return 0, false
	}
	if p <= 0.5 {
		if p*float64(n) > 30 {
			return 0, false
		}
		return r.binomialInversion(n, p), true
	}
	q := 1 - p
	if q*float64(n) > 30 {
		return 0, false
	}
	return n - r.binomialInversion(n, q), true
}

func (r *MT19937) binomialInversion(n int64, p float64) int64 {
	q := 1 - p
	qn := math.Exp(float64(n) * math.Log(q))
	np := float64(n) * p
	bound := int64(math.Min(float64(n), np+10*math.Sqrt(np*q+1)))
	x := int64(0)
	px := qn
	u := r.Float64()
	for u > px {
		x++
		if x > bound {
			x = 0
			px = qn
			u = r.Float64()
		} else {
			u -= px
			px = (float64(n-x+1) * p * px) / (float64(x) * q)
		}
	}
	return x
}
