package cuda

import "time"

// Event marks a point in the Device's stream, for timing GPU work.
type Event struct {
	d  *Device
	ev uintptr
}

// NewEvent creates an event (with timing enabled).
func (d *Device) NewEvent() (*Event, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	e := &Event{d: d}
	if err := d.api.check("cuEventCreate", d.api.cuEventCreate(&e.ev, 0)); err != nil {
		return nil, err
	}
	return e, nil
}

// Record queues the event on the stream: it completes when the work queued
// before it has.
func (e *Event) Record() error {
	d := e.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	r := call(d.api.cuEventRecord, e.ev, d.stream)
	d.mu.Unlock()
	return d.api.check("cuEventRecord", r)
}

// Synchronize waits until the event completes.
func (e *Event) Synchronize() error {
	d := e.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return d.api.check("cuEventSynchronize", d.api.cuEventSynchronize(e.ev))
}

// Elapsed waits for end and returns the GPU time from e to end (both
// recorded), with the driver's resolution of about half a microsecond.
func (e *Event) Elapsed(end *Event) (time.Duration, error) {
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	d := e.d
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.leave()
	var ms float32
	if err := d.api.check("cuEventElapsedTime", d.api.cuEventElapsedTime(&ms, e.ev, end.ev)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	d := e.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return d.api.check("cuEventDestroy_v2", d.api.cuEventDestroy(e.ev))
}
