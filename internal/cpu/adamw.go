package cpu

import (
	"fmt"
	"math"
)

// AdamWCoeffs are the float32 scalars of one AdamW update, as Apex's
// FusedAdam (adam_w_mode) takes them. The caller computes them once per step
// and group; OneMinusBeta* are 1−β rounded to float32 (the CUDA kernel does
// that subtraction in float32), BC* the bias corrections 1−βᵗ.
type AdamWCoeffs struct {
	Beta1, Beta2                 float32
	OneMinusBeta1, OneMinusBeta2 float32
	Eps                          float32
	BC1, BC2                     float32
	LR, WD                       float32
}

// AdamWUpdate applies one AdamW step elementwise (p, g, m, v of equal
// length; m is exp_avg, v exp_avg_sq):
//
//	m ← β1·m + (1−β1)·g
//	v ← β2·v + ((1−β2)·g)·g
//	p ← p − lr·((m/bc1)/(√(v/bc2) + eps) + wd·p)
//
// Every product, quotient and sum is rounded to float32 in this order with
// no fused multiply-add, and the square root is correctly rounded, so the
// AVX-512, AVX2 and pure-Go paths (per ActiveISA) give bit-identical results,
// NaN and Inf included. It panics if the lengths differ (a programming
// error). It does not split work over threads; callers use Parallel.
func AdamWUpdate(p, g, m, v []float32, c *AdamWCoeffs) {
	if len(g) != len(p) || len(m) != len(p) || len(v) != len(p) {
		panic(fmt.Sprintf("cpu: AdamWUpdate: len(p)=%d len(g)=%d len(m)=%d len(v)=%d, want equal", len(p), len(g), len(m), len(v)))
	}
	k := adamwVec(p, g, m, v, c)
	adamwGo(p[k:], g[k:], m[k:], v[k:], c)
}

// adamwGo is the pure-Go path and the reference the assembly must match
// bit for bit (the loop optim's AdamW ran before the kernels existed).
func adamwGo(p, g, m, v []float32, c *AdamWCoeffs) {
	if len(p) == 0 {
		return
	}
	b1, b2, omb1, omb2, eps, bc1, bc2 := c.Beta1, c.Beta2, c.OneMinusBeta1, c.OneMinusBeta2, c.Eps, c.BC1, c.BC2
	lr, wd := c.LR, c.WD
	_, _, _ = g[len(p)-1], m[len(p)-1], v[len(p)-1]
	for j := range p {
		gj := g[j]
		// float32(...) around each product forbids FMA fusion, so results
		// do not depend on GOAMD64.
		mj := float32(b1*m[j]) + float32(omb1*gj)
		vj := float32(b2*v[j]) + float32(float32(omb2*gj)*gj)
		m[j], v[j] = mj, vj
		denom := float32(math.Sqrt(float64(vj/bc2))) + eps
		p[j] -= float32(lr * (mj/bc1/denom + float32(wd*p[j])))
	}
}
