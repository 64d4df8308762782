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
