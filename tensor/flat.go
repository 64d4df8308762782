package tensor

import "fmt"

// MoveInto copies a contiguous float32 leaf tensor's values into dst — a
// contiguous float32 tensor of the same element count on the same device,
// typically a view of one flat buffer — and makes dst's storage t's, so that
// many parameters can live in one flat buffer a collective updates at once
// (the distributed optimizer's parameter all-gather). It is MoveTo for
// tensors on any device. Views taken of t before the move keep the old
// storage.
func (t *Tensor) MoveInto(dst *Tensor) error {
	switch {
	case t.dtype != Float32 || !t.leaf || !t.IsContiguous():
		return fmt.Errorf("tensor: MoveInto %s: want a contiguous float32 leaf tensor", t.Name)
	case dst.dtype != Float32 || !dst.IsContiguous():
		return fmt.Errorf("tensor: MoveInto %s: the destination is not a contiguous float32 tensor", t.Name)
	case dst.dev != t.dev:
		return fmt.Errorf("tensor: MoveInto %s: the tensor is on the %v device, the destination on %v", t.Name, t.dev, dst.dev)
	case dst.Numel() != t.Numel():
		return fmt.Errorf("tensor: MoveInto %s: destination of %d values for %v (%d)", t.Name, dst.Numel(), t.shape, t.Numel())
	}
	backendFor(dst, t).CopyStrided(dst, t)
	t.shareStorage(dst)
	t.offset = dst.offset
	return nil
}

// Adopt makes dst's storage t's without copying any value: t (a contiguous
// float32 leaf) becomes a view of dst, which must be a contiguous float32
// tensor of t's element count on t's device. Fully sharded data
// parallelism points a parameter at the buffer its values were just
// all-gathered into.
func (t *Tensor) Adopt(dst *Tensor) error {
	switch {
	case t.dtype != Float32 || !t.leaf:
		return fmt.Errorf("tensor: Adopt %s: want a float32 leaf tensor", t.Name)
	case dst.dtype != Float32 || !dst.IsContiguous():
		return fmt.Errorf("tensor: Adopt %s: the new storage is not a contiguous float32 tensor", t.Name)
	case dst.dev != t.dev:
		return fmt.Errorf("tensor: Adopt %s: the tensor is on the %v device, the new storage on %v", t.Name, t.dev, dst.dev)
	case dst.Numel() != t.Numel():
		return fmt.Errorf("tensor: Adopt %s: new storage of %d values for %v (%d)", t.Name, dst.Numel(), t.shape, t.Numel())
	}
	t.shareStorage(dst)
	t.offset = dst.offset
	t.strides = contiguousStrides(t.shape)
	return nil
}

// Release drops t's storage: its values are gone (reading them panics)
// until Adopt gives it storage again. Views taken earlier keep the old
// storage alive. Fully sharded data parallelism releases a layer's
// gathered parameters after the layer has run.
func (t *Tensor) Release() {
	t.f32, t.u16, t.i32, t.i64, t.dbuf = nil, nil, nil, nil, nil
	t.offset = 0
}

// Released reports whether t has no storage (Release).
func (t *Tensor) Released() bool {
	return t.f32 == nil && t.u16 == nil && t.i32 == nil && t.i64 == nil && t.dbuf == nil && t.Numel() > 0
}
