package tensor

import (
	"math"

	"github.com/gotron/gotron/internal/cpu"
)

// The CPU backend's multi-tensor ops. Each splits the flat index space of
// its first list over cpu.Parallel (element ops in chunks of at least 16 Ki
// elements, statistics by NormBlock), through work functions built once per
// list and kept in it, so a call allocates nothing after the first.

// cpuList is the CPU backend's state for one TensorList: the work functions
// handed to cpu.Parallel and the arguments of the call in flight (a list is
// not safe for concurrent use, so one set suffices).
type cpuList struct {
	l *TensorList

	// Arguments of the op in flight (SGD's momentum buffer is in expAvg).
	grads, expAvg, expAvgSq *TensorList
	adamw                   []AdamWCoeffs
	sgd                     []SGDCoeffs
	alpha                   float32

	partial []float64 // per NormBlock: sum of squares or max |x|
	found   []bool    // per NormBlock: holds NaN or ±Inf

	adamwK, sgdK, scaleK func(lo, hi int)
	sumK, maxK, infK     func(lo, hi int)
}

// elemGrain is the smallest chunk, in elements, of an elementwise list op.
const elemGrain = 1 << 14

// cpuListOf returns l's CPU state, building it on first use.
func cpuListOf(l *TensorList) *cpuList {
	if c, ok := l.cache.(*cpuList); ok {
		return c
	}
	nb := (l.Numel() + NormBlock - 1) / NormBlock
	c := &cpuList{l: l, partial: make([]float64, nb), found: make([]bool, nb)}
	c.adamwK = func(lo, hi int) { l.each(lo, hi, c.adamwRange) }
	c.sgdK = func(lo, hi int) { l.each(lo, hi, c.sgdRange) }
	c.scaleK = func(lo, hi int) { l.each(lo, hi, c.scaleRange) }
	c.sumK = func(lo, hi int) { c.blocks(lo, hi, c.sumBlock) }
	c.maxK = func(lo, hi int) { c.blocks(lo, hi, c.maxBlock) }
	c.infK = func(lo, hi int) { c.blocks(lo, hi, c.infBlock) }
	l.cache = c
	return c
}

// host returns elements [a, b) of tensor i of l.
func host(l *TensorList, i, a, b int) []float32 { return l.ts[i].f32s()[a:b] }

func (cpuBackend) AdamW(params, grads, expAvg, expAvgSq *TensorList, coeffs []AdamWCoeffs) {
	c := cpuListOf(params)
	c.grads, c.expAvg, c.expAvgSq, c.adamw = grads, expAvg, expAvgSq, coeffs
	cpu.Parallel(params.Numel(), elemGrain, c.adamwK)
	c.grads, c.expAvg, c.expAvgSq, c.adamw = nil, nil, nil, nil
}

// adamwRange runs cpu.AdamWUpdate (AVX-512, AVX2 or pure Go, bit-identical)
// on elements [a, b) of tensor i.
func (c *cpuList) adamwRange(i, a, b int) {
	// AdamWCoeffs has cpu.AdamWCoeffs's fields in its order: a conversion.
	cpu.AdamWUpdate(host(c.l, i, a, b), host(c.grads, i, a, b), host(c.expAvg, i, a, b), host(c.expAvgSq, i, a, b),
		(*cpu.AdamWCoeffs)(&c.adamw[i]))
}

func (cpuBackend) SGD(params, grads, momentum *TensorList, coeffs []SGDCoeffs) {
	c := cpuListOf(params)
	c.grads, c.expAvg, c.sgd = grads, momentum, coeffs
	cpu.Parallel(params.Numel(), elemGrain, c.sgdK)
	c.grads, c.expAvg, c.sgd = nil, nil, nil
}

// sgdRange is the elementwise SGD update of elements [a, b) of tensor i
// (the momentum buffer, if any, is in c.expAvg).
func (c *cpuList) sgdRange(i, a, b int) {
	p, g := host(c.l, i, a, b), host(c.grads, i, a, b)
	k := &c.sgd[i]
	lr, wd := k.LR, k.WD
	if c.expAvg == nil {
		for j := range p {
			d := g[j]
			if wd != 0 {
				d += float32(wd * p[j])
			}
			p[j] -= float32(lr * d)
		}
		return
	}
	buf := host(c.expAvg, i, a, b)
	mom, omd, first, nesterov := k.Momentum, k.OneMinusDampening, k.FirstStep, k.Nesterov
	for j := range p {
		d := g[j]
		if wd != 0 {
			d += float32(wd * p[j]) // float32(...): no FMA fusion
		}
		if first {
			buf[j] = d
		} else {
			buf[j] = float32(mom*buf[j]) + float32(omd*d)
		}
		if nesterov {
			d += float32(mom * buf[j])
		} else {
			d = buf[j]
		}
		p[j] -= float32(lr * d)
	}
}

func (cpuBackend) ScaleList(l *TensorList, alpha float32) {
	c := cpuListOf(l)
	c.alpha = alpha
	cpu.Parallel(l.Numel(), elemGrain, c.scaleK)
}

// scaleRange multiplies elements [a, b) of tensor i by c.alpha.
func (c *cpuList) scaleRange(i, a, b int) {
	s := c.alpha
	x := host(c.l, i, a, b)
	for j := range x {
		x[j] *= s
	}
}

// blocks runs fn on each NormBlock index in [lo, hi).
func (c *cpuList) blocks(lo, hi int, fn func(blk int)) {
	for b := lo; b < hi; b++ {
		fn(b)
	}
}

// blockRange returns the flat range of block blk.
func (c *cpuList) blockRange(blk int) (int, int) {
	return blk * NormBlock, min((blk+1)*NormBlock, c.l.Numel())
}

func (cpuBackend) SumSquares(out *Tensor, l *TensorList) {
	s := 0.0
	if l.Numel() > 0 {
		c := cpuListOf(l)
		cpu.Parallel(len(c.partial), 1, c.sumK)
		for _, p := range c.partial {
			s += p
		}
	}
	out.i64[out.offset] = int64(math.Float64bits(s))
}

// sumBlock stores Σ x² over block blk, accumulated in float64.
func (c *cpuList) sumBlock(blk int) {
	s := 0.0
	lo, hi := c.blockRange(blk)
	c.l.each(lo, hi, func(i, a, b int) { s += sumSquares(host(c.l, i, a, b)) })
	c.partial[blk] = s
}

// sumSquares returns Σ x² in float64 with four interleaved accumulators
// (a fixed order, so the result depends only on x).
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i]) * float64(x[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func (cpuBackend) MaxAbs(l *TensorList) float64 {
	c := cpuListOf(l)
	cpu.Parallel(len(c.partial), 1, c.maxK)
	m := 0.0
	for _, p := range c.partial {
		if p > m || p != p {
			m = p
		}
	}
	return m
}

// maxBlock stores max |x| over block blk (NaN propagates).
func (c *cpuList) maxBlock(blk int) {
	m := 0.0
	lo, hi := c.blockRange(blk)
	c.l.each(lo, hi, func(i, a, b int) {
		if ax := maxAbs(host(c.l, i, a, b)); ax > m || ax != ax {
			m = ax
		}
	})
	c.partial[blk] = m
}

// maxAbs returns max |x| (NaN if any x is NaN; 0 for empty x).
func maxAbs(x []float32) float64 {
	var m float32
	for _, v := range x {
		a := float32(math.Abs(float64(v)))
		if a > m || a != a {
			m = a
			if a != a {
				break
			}
		}
	}
	return float64(m)
}

func (cpuBackend) NonFinite(out *Tensor, l *TensorList) {
	out.i32[out.offset] = 0
	if l.Numel() == 0 {
		return
	}
	c := cpuListOf(l)
	cpu.Parallel(len(c.found), 1, c.infK)
	for _, b := range c.found {
		if b {
			out.i32[out.offset] = 1
			return
		}
	}
}

// infBlock records whether block blk holds a NaN or ±Inf.
func (c *cpuList) infBlock(blk int) {
	bad := false
	lo, hi := c.blockRange(blk)
	c.l.each(lo, hi, func(i, a, b int) {
		if cpu.NonFinite(host(c.l, i, a, b)) { // AVX-512/AVX2 scan
			bad = true
		}
	})
	c.found[blk] = bad
}
