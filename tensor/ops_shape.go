package tensor

import "fmt"

// Reshape returns t with a new shape of the same number of elements (one -1
// is inferred). Contiguous inputs give a view; others are copied first.
func (tp *Tape) Reshape(t *Tensor, shape ...int) *Tensor {
	shape = inferShape(t.Numel(), shape)
	src := tp.Contiguous(t)
	out := src.view(shape, contiguousStrides(shape), src.offset)
	if tp.recording(src) {
		tp.record("reshape", func(tp *Tape) { tp.passGrad(src, out) }, out)
	}
	return out
}

func inferShape(n int, shape []int) []int {
	shape = append([]int(nil), shape...)
	known, infer := 1, -1
	for i, s := range shape {
		if s == -1 {
			if infer >= 0 {
				panic(fmt.Sprintf("tensor: reshape %v has two -1 dims", shape))
			}
			infer = i
		} else {
			known *= s
		}
	}
	if infer >= 0 && known > 0 {
		shape[infer] = n / known
		known *= shape[infer]
	}
	if known != n {
		panic(fmt.Sprintf("tensor: cannot reshape %d elements to %v", n, shape))
	}
	return shape
}

// Contiguous returns t when it is dense, else a recorded dense copy.
func (tp *Tape) Contiguous(t *Tensor) *Tensor {
	if t.IsContiguous() {
		return t
	}
	if t.dtype != Float32 {
		return t.Contiguous() // ids and masks: no gradient
	}
	out := tp.empty(t.dev, t.shape...)
	be := backendFor(t)
	be.CopyStrided(out, t)
	if tp.recording(t) {
		src := t
		tp.record("contiguous", func(tp *Tape) {
			g := tp.grad(out)
			// Scatter the dense gradient back through src's strides into the
			// base gradient of the viewed tensor.
			base := src.base
			if base == nil {
				panic("tensor: gradient through a strided view without a base")
			}
			bg := tp.gradFor(base)
			be.ScatterAddStrided(bg, src, g)
		}, out)
	}
	return out
}

// Transpose swaps dims i and j as a strided view (no copy). Ops needing
// dense input copy it through Contiguous, which carries the gradient back.
func (tp *Tape) Transpose(t *Tensor, i, j int) *Tensor {
	nd := len(t.shape)
	if i < 0 {
		i += nd
	}
	if j < 0 {
		j += nd
	}
	shape := append([]int(nil), t.shape...)
	strides := append([]int(nil), t.strides...)
	shape[i], shape[j] = shape[j], shape[i]
	strides[i], strides[j] = strides[j], strides[i]
	return tp.stridedView(t, shape, strides, t.offset)
}

// Narrow returns elements [start, start+length) of dim as a view.
func (tp *Tape) Narrow(t *Tensor, dim, start, length int) *Tensor {
	if dim < 0 {
		dim += len(t.shape)
	}
	if start < 0 || length < 0 || start+length > t.shape[dim] {
		panic(fmt.Sprintf("tensor: narrow dim %d [%d,%d) of shape %v", dim, start, start+length, t.shape))
	}
	shape := append([]int(nil), t.shape...)
	shape[dim] = length
	return tp.stridedView(t, shape, append([]int(nil), t.strides...), t.offset+start*t.strides[dim])
}

// stridedView makes a view whose gradient flows through Contiguous: the view
// remembers its base tensor.
func (tp *Tape) stridedView(t *Tensor, shape, strides []int, offset int) *Tensor {
	out := t.view(shape, strides, offset)
	out.base = t
	if t.base != nil { // views of views address the same base storage
		out.base = t.base
	}
	if t.requiresGrad {
		out.requiresGrad = true
		out.leaf = false
	}
	if out.IsContiguous() && tp.recording(t) {
		// A dense view (e.g. narrowing the first dim) can be used directly by
		// kernels; route its gradient into the base by offset.
		tp.record("view", func(tp *Tape) {
			backendFor(out).ScatterAddStrided(tp.gradFor(out.base), out, tp.grad(out))
		}, out)
	}
	return out
}

// Split splits dim into pieces of the given sizes (views).
func (tp *Tape) Split(t *Tensor, dim int, sizes ...int) []*Tensor {
	if dim < 0 {
		dim += len(t.shape)
	}
	total := 0
	for _, s := range sizes {
		total += s
	}
	if total != t.shape[dim] {
		panic(fmt.Sprintf("tensor: split sizes %v do not sum to dim %d of %v", sizes, dim, t.shape))
	}
	out := make([]*Tensor, len(sizes))
	start := 0
	for i, s := range sizes {
		out[i] = tp.Narrow(t, dim, start, s)
		start += s
	}
	return out
}

// Concat joins tensors of equal shape except along dim.
func (tp *Tape) Concat(dim int, ts ...*Tensor) *Tensor {
	if dim < 0 {
		dim += len(ts[0].shape)
	}
	shape := append([]int(nil), ts[0].shape...)
	shape[dim] = 0
	for _, t := range ts {
		for d := range shape {
			if d != dim && t.shape[d] != shape[d] {
				panic(fmt.Sprintf("tensor: concat of %v and %v along dim %d", ts[0].shape, t.shape, dim))
			}
		}
		shape[dim] += t.shape[dim]
	}
	out := tp.empty(ts[0].dev, shape...)
	be := backendFor(ts...)
	// part returns the block of x (a tensor of out's shape) that input i
	// fills: a strided view, dim narrowed to [pos, pos+size).
	part := func(x *Tensor, pos, size int) *Tensor {
		sh := append([]int(nil), shape...)
		sh[dim] = size
		return x.view(sh, contiguousStrides(shape), x.offset+pos*x.strides[dim])
	}
	pos := 0
	dense := make([]*Tensor, len(ts))
	for i, t := range ts {
		dense[i] = tp.Contiguous(t)
		be.CopyStrided(part(out, pos, t.shape[dim]), dense[i])
		pos += t.shape[dim]
	}
	if tp.recording(dense...) {
		tp.record("concat", func(tp *Tape) {
			g := tp.grad(out)
			pos := 0
			for _, t := range dense {
				if dg := tp.gradFor(t); dg != nil {
					// Gather the block, then add it: dg += g's block.
					blk := tp.empty(t.dev, t.shape...)
					be.CopyStrided(blk, part(g, pos, t.shape[dim]))
					be.Axpy(dg, 1, blk)
				}
				pos += t.shape[dim]
			}
		}, out)
	}
	return out
}
