package tensor

import (
	"math"

	"github.com/gotron/gotron/internal/cpu"
)

// The CPU backend's vocab-parallel ops: the row passes are internal/cpu's
// (parallel over rows, vectorised exp), the per-row finishing work serial.

func (cpuBackend) VocabEmbeddingForward(out, table, ids *Tensor, start int) {
	vl, h := table.Dim(0), table.Dim(-1)
	dst, w := f(out), f(table)
	clear(dst)
	for i, id := range ids.i32s() {
		if j := int(id) - start; j >= 0 && j < vl {
			copy(dst[i*h:(i+1)*h], w[j*h:(j+1)*h])
		}
	}
}

func (cpuBackend) VocabEmbeddingBackward(dtable, dout, ids *Tensor, start int) {
	vl, h := dtable.Dim(0), dtable.Dim(-1)
	dw, gs := f(dtable), f(dout)
	clear(dw)
	for i, id := range ids.i32s() {
		if j := int(id) - start; j >= 0 && j < vl {
			row := dw[j*h : (j+1)*h]
			for k, v := range gs[i*h : (i+1)*h] {
				row[k] += v
			}
		}
	}
}

func (cpuBackend) RowMax(m, x *Tensor) {
	cpu.RowMax(f(m), f(x), x.Dim(0), x.Dim(-1))
}

func (cpuBackend) VocabCrossEntropyPartials(partials, x, rowMax, targets *Tensor, start int) {
	n, vl := x.Dim(0), x.Dim(-1)
	both, xs, m := f(partials), f(x), f(rowMax)
	cpu.RowExpSum(both[:n], xs, m, n, vl)
	for i, t := range targets.i32s() {
		both[n+i] = 0
		if j := int(t) - start; j >= 0 && j < vl {
			both[n+i] = xs[i*vl+j] - m[i]
		}
	}
}

func (cpuBackend) VocabCrossEntropyLoss(loss, lse, denT, partials, rowMax, mask *Tensor) {
	n := rowMax.Numel()
	both, m, l, mk := f(partials), f(rowMax), f(lse), f(mask)
	var num, den float64
	for i := range n {
		w := 1.0
		if mk != nil {
			w = float64(mk[i])
		}
		s := math.Log(float64(both[i]))
		l[i] = float32(float64(m[i]) + s)
		num += (s - float64(both[n+i])) * w
		den += w
	}
	out := f(loss)
	out[0] = 0
	if den > 0 {
		out[0] = float32(num / den)
	}
	denT.i64[denT.offset] = int64(math.Float64bits(den))
}

func (cpuBackend) VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, denT *Tensor, start int) {
	den := math.Float64frombits(uint64(denT.i64[denT.offset]))
	n, vl := x.Dim(0), x.Dim(-1)
	gl, mk := f(dloss)[0], f(mask)
	scale := make([]float32, n)
	if den > 0 {
		for i := range n {
			w := float32(1)
			if mk != nil {
				w = mk[i]
			}
			scale[i] = gl * w / float32(den)
		}
	}
	d := f(dx)
	cpu.RowSoftmaxScaled(d, f(x), f(lse), scale, n, vl)
	for i, t := range targets.i32s() {
		if j := int(t) - start; j >= 0 && j < vl {
			d[i*vl+j] -= scale[i]
		}
	}
}
