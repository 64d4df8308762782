package cuda

import (
	"fmt"
	"unsafe"
)

// Staged host-to-device copies: CopyHtoD waits for the stream (the driver
// may read a pageable source until the copy is done), so a small upload in
// the middle of queued work (an optimizer's coefficient table, a batch)
// stalls the host until the GPU has caught up. CopyHtoDStaged instead
// copies the bytes into a slot of a ring of page-locked buffers, queues the
// device copy from there and returns: the caller may reuse its memory at
// once, and the host keeps queuing work. A slot is reused only after the
// event recorded behind its copy has completed (normally long since).
//
// Built, not yet run on a GPU: TestGPUCopyHtoDStaged checks it there, and
// the tensor package uses it only when GOTRON_CUDA_UNVERIFIED is 1 or names staged-copies.

const (
	// StagingSlotBytes is the largest copy CopyHtoDStaged stages; larger
	// ones take CopyHtoD.
	StagingSlotBytes = 64 << 10
	stagingSlots     = 16
	eventNoTiming    = 0x2 // CU_EVENT_DISABLE_TIMING
)

// stagingRing is the Device's page-locked staging memory (C memory from
// cuMemAllocHost, stagingSlots × StagingSlotBytes) and an event per slot.
type stagingRing struct {
	base   unsafe.Pointer
	events [stagingSlots]uintptr
	used   [stagingSlots]bool
	next   int
}

// CopyHtoDStaged copies n bytes from host memory src to dst without
// waiting for the stream when n <= StagingSlotBytes (through the staging
// ring), else as CopyHtoD. Either way src may be reused when it returns,
// and the copy is ordered on the stream after earlier work.
func (d *Device) CopyHtoDStaged(dst Ptr, src unsafe.Pointer, n int64) error {
	if n > StagingSlotBytes {
		return d.CopyHtoD(dst, src, n)
	}
	if n == 0 {
		return nil
	}
	if n < 0 || src == nil || dst == 0 {
		return fmt.Errorf("cuda: CopyHtoDStaged of %d bytes to %#x from %p: want a positive size and non-nil addresses", n, uintptr(dst), src)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.staging == nil {
		if err := d.newStagingLocked(); err != nil {
			return err
		}
	}
	r := d.staging
	s := r.next
	if r.used[s] { // the copy that last used this slot must have read it
		if err := d.api.check("cuEventSynchronize", d.api.cuEventSynchronize(r.events[s])); err != nil {
			return err
		}
	}
	slot := unsafe.Add(r.base, s*StagingSlotBytes)
	copy(unsafe.Slice((*byte)(slot), n), unsafe.Slice((*byte)(src), n))
	if err := d.api.check("cuMemcpyHtoDAsync_v2", d.api.cuMemcpyHtoDAsync(uintptr(dst), slot, uint64(n), d.stream)); err != nil {
		return err
	}
	if err := d.api.check("cuEventRecord", call(d.api.cuEventRecord, r.events[s], d.stream)); err != nil {
		return err
	}
	r.used[s] = true
	r.next = (s + 1) % stagingSlots
	return nil
}

// newStagingLocked allocates the staging ring (d.mu held, context current).
func (d *Device) newStagingLocked() error {
	r := &stagingRing{}
	if err := d.api.check("cuMemAllocHost_v2", d.api.cuMemAllocHost(&r.base, stagingSlots*StagingSlotBytes)); err != nil {
		return fmt.Errorf("cuda: staging buffers (%d KiB page-locked): %w", stagingSlots*StagingSlotBytes>>10, err)
	}
	for i := range r.events {
		if err := d.api.check("cuEventCreate", d.api.cuEventCreate(&r.events[i], eventNoTiming)); err != nil {
			d.freeStaging(r)
			return err
		}
	}
	d.staging = r
	return nil
}

// freeStaging releases r's events and memory (the stream synchronized).
func (d *Device) freeStaging(r *stagingRing) error {
	var first error
	for _, ev := range r.events {
		if ev != 0 {
			if err := d.api.check("cuEventDestroy", d.api.cuEventDestroy(ev)); err != nil && first == nil {
				first = err
			}
		}
	}
	if err := d.api.check("cuMemFreeHost", d.api.cuMemFreeHost(r.base)); err != nil && first == nil {
		first = err
	}
	return first
}
