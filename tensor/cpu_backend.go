package tensor

import (
	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/half"
)

// cpuBackend runs ops with internal/cpu kernels on host float32 storage.
type cpuBackend struct{}

var _ Backend = cpuBackend{}

func f(t *Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.f32s()
}

func (cpuBackend) Name() string { return "cpu" }

func (cpuBackend) Device() Device { return CPU }

func (cpuBackend) Gemm(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, b *Tensor, beta float32, c *Tensor) {
	m, n := c.Dim(-2), c.Dim(-1)
	k := a.Dim(-1)
	if tA == Trans {
		k = a.Dim(-2)
	}
	batch := c.Numel() / (m * n)
	lda, ldb := a.Dim(-1), b.Dim(-1)
	sa, sb := a.Dim(-1)*a.Dim(-2), b.Dim(-1)*b.Dim(-2)
	if a.Numel() == sa { // a shared by every batch entry (a weight)
		sa = 0
	}
	if b.Numel() == sb {
		sb = 0
	}
	gemm := cpu.SgemmStrided
	var av, bv []float32
	if a.dtype == BFloat16 && b.dtype == BFloat16 && prec == MatmulBF16 {
		// bfloat16 operands (the simulated device's, bf16_operands.go):
		// widened exactly, SgemmStridedBF16's rounding leaves them as they
		// are, so the product is MatmulBF16's on their float32 sources.
		av, bv = widenBF16(a), widenBF16(b)
	} else {
		av, bv = f(a), f(b)
	}
	switch prec {
	case MatmulBF16:
		gemm = cpu.SgemmStridedBF16
	case MatmulFP16:
		av, bv = roundFP16(av), roundFP16(bv)
	}
	gemm(tA, tB, m, n, k, alpha, av, lda, sa, bv, ldb, sb, beta, f(c), n, m*n, batch)
}

func rowsCols(t *Tensor) (int, int) {
	c := t.Dim(-1)
	if c == 0 {
		return 0, 0
	}
	return t.Numel() / c, c
}

func (cpuBackend) LayerNormForward(out, mean, rstd, x, w, b *Tensor, eps float32) {
	n, c := rowsCols(x)
	cpu.LayerNormForward(f(out), f(mean), f(rstd), f(x), f(w), f(b), n, c, eps)
}

func (cpuBackend) LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd *Tensor) {
	n, c := rowsCols(x)
	cpu.LayerNormBackward(f(dx), f(dw), f(db), f(dout), f(x), f(w), f(mean), f(rstd), n, c)
}

func (cpuBackend) RMSNormForward(out, rstd, x, w *Tensor, eps float32) {
	n, c := rowsCols(x)
	cpu.RMSNormForward(f(out), f(rstd), f(x), f(w), n, c, eps)
}

func (cpuBackend) RMSNormBackward(dx, dw, dout, x, w, rstd *Tensor) {
	n, c := rowsCols(x)
	cpu.RMSNormBackward(f(dx), f(dw), f(dout), f(x), f(w), f(rstd), n, c)
}

func (cpuBackend) GELUForward(out, x *Tensor, tanh bool) {
	if tanh {
		cpu.GELUTanhForward(f(out), f(x))
	} else {
		cpu.GELUErfForward(f(out), f(x))
	}
}

func (cpuBackend) GELUBackward(dx, dout, x *Tensor, tanh bool) {
	if tanh {
		cpu.GELUTanhBackward(f(dx), f(dout), f(x))
	} else {
		cpu.GELUErfBackward(f(dx), f(dout), f(x))
	}
}

func (cpuBackend) SiLUForward(out, x *Tensor)        { cpu.SiLUForward(f(out), f(x)) }
func (cpuBackend) SiLUBackward(dx, dout, x *Tensor)  { cpu.SiLUBackward(f(dx), f(dout), f(x)) }
func (cpuBackend) SquaredReLUForward(out, x *Tensor) { cpu.SquaredReLUForward(f(out), f(x)) }
func (cpuBackend) SquaredReLUBackward(dx, dout, x *Tensor) {
	cpu.SquaredReLUBackward(f(dx), f(dout), f(x))
}

func (cpuBackend) SwiGLUForward(out, x *Tensor) {
	n, c := rowsCols(x)
	cpu.SwiGLUForward(f(out), f(x), n, c/2)
}

func (cpuBackend) SwiGLUBackward(dx, dout, x *Tensor) {
	n, c := rowsCols(x)
	cpu.SwiGLUBackward(f(dx), f(dout), f(x), n, c/2)
}

func (cpuBackend) SoftmaxForward(out, x *Tensor) {
	n, c := rowsCols(x)
	cpu.SoftmaxForward(f(out), f(x), n, c)
}

func (cpuBackend) SoftmaxBackward(dx, dout, out *Tensor) {
	n, c := rowsCols(out)
	cpu.SoftmaxBackward(f(dx), f(dout), f(out), n, c)
}

func positionsOf(p *Tensor) []int32 {
	if p == nil {
		return nil
	}
	return p.i32s()
}

func (cpuBackend) RoPEForward(r *RoPE, out, x *Tensor, positions *Tensor) {
	r.cpu.Forward(f(out), f(x), positionsOf(positions), x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3))
}

func (cpuBackend) RoPEBackward(r *RoPE, dx, dout *Tensor, positions *Tensor) {
	r.cpu.Backward(f(dx), f(dout), positionsOf(positions), dout.Dim(0), dout.Dim(1), dout.Dim(2), dout.Dim(3))
}

// cpuAttention is cfg in the kernel's terms.
func cpuAttention(cfg AttentionConfig) cpu.AttentionConfig {
	c := cpu.AttentionConfig{B: cfg.B, T: cfg.T, HQ: cfg.HQ, HKV: cfg.HKV, D: cfg.D, Scale: cfg.Scale, Causal: cfg.Causal,
		Dropout: cfg.Dropout, DropoutSeed: cfg.DropoutSeed, FirstHead: cfg.FirstHead,
		QPos: cfg.QPos, KPos: cfg.KPos, Accumulate: cfg.Accumulate}
	if cfg.DocIDs != nil {
		c.DocIDs = cfg.DocIDs.i32s()
	}
	return c
}

func (cpuBackend) AttentionForward(out, lse, q, k, v *Tensor, cfg AttentionConfig) {
	cpu.AttentionForward(f(out), f(lse), f(q), f(k), f(v), cpuAttention(cfg))
}

func (cpuBackend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig) {
	cpu.AttentionBackward(f(dq), f(dk), f(dv), f(dout), f(q), f(k), f(v), f(out), f(lse), cpuAttention(cfg))
}

func (cpuBackend) CrossEntropyForward(losses, lse, logits, targets *Tensor, cfg CrossEntropyConfig) {
	cpu.CrossEntropyForward(f(losses), f(lse), f(logits), targets.i32s(), cpu.CrossEntropyConfig(cfg))
}

func (cpuBackend) CrossEntropyBackward(dlogits, logits, lse, targets, dlosses *Tensor, cfg CrossEntropyConfig) {
	cpu.CrossEntropyBackward(f(dlogits), f(logits), f(lse), targets.i32s(), f(dlosses), cpu.CrossEntropyConfig(cfg))
}

func (cpuBackend) EmbeddingForward(out, table, ids *Tensor) {
	c := table.Dim(-1)
	tab, o, id := f(table), f(out), ids.i32s()
	cpu.Parallel(len(id), 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(o[i*c:(i+1)*c], tab[int(id[i])*c:(int(id[i])+1)*c])
		}
	})
}

func (cpuBackend) EmbeddingBackward(dtable, dout, ids *Tensor) {
	// Serial scatter-add: rows may repeat, and the order keeps it deterministic.
	c := dtable.Dim(-1)
	dt, d, id := f(dtable), f(dout), ids.i32s()
	for i, r := range id {
		axpy(dt[int(r)*c:(int(r)+1)*c], d[i*c:(i+1)*c], 1)
	}
}

func (cpuBackend) Add(out, a, b *Tensor) {
	o, x, y := f(out), f(a), f(b)
	nb := len(y)
	cpu.Parallel(len(x)/max(nb, 1), max(1, 16384/max(nb, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			cpu.Add(o[r*nb:(r+1)*nb], x[r*nb:(r+1)*nb], y)
		}
	})
}

func (cpuBackend) Mul(out, a, b *Tensor) {
	o, x, y := f(out), f(a), f(b)
	nb := len(y)
	cpu.Parallel(len(x)/max(nb, 1), max(1, 16384/max(nb, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			oo, xx := o[r*nb:(r+1)*nb], x[r*nb:(r+1)*nb]
			for i, v := range y {
				oo[i] = xx[i] * v
			}
		}
	})
}

func (cpuBackend) Axpy(y *Tensor, alpha float32, x *Tensor) {
	yy, xx := f(y), f(x)
	cpu.Parallel(len(xx), 1<<15, func(lo, hi int) { axpy(yy[lo:hi], xx[lo:hi], alpha) })
}

func (cpuBackend) Scale(out *Tensor, alpha float32, x *Tensor) {
	o, xx := f(out), f(x)
	cpu.Parallel(len(xx), 1<<15, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = alpha * xx[i]
		}
	})
}

func (cpuBackend) SumRows(out, x *Tensor) {
	n, c := rowsCols(x)
	o, xx := f(out), f(x)
	// Split columns across threads so each sums its own slice: deterministic.
	cpu.Parallel(c, 256, func(lo, hi int) {
		for r := range n {
			axpy(o[lo:hi], xx[r*c+lo:r*c+hi], 1)
		}
	})
}

// roundFP16 returns a copy of x rounded to IEEE half precision (MatmulFP16).
func roundFP16(x []float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = half.Float16From(v).Float32()
	}
	return out
}
