package cuda

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Size classes of the caching allocator. Requests below smallLimit are
// rounded up to a multiple of smallRound, larger ones to a multiple of
// largeRound, so that freed blocks are reused by later requests of a nearby
// size instead of reaching cuMemAlloc (which synchronizes and is slow).
const (
	smallRound = 512
	largeRound = 2 << 20
	smallLimit = 1 << 20
	maxAlloc   = 1 << 50 // far beyond any GPU; keeps the rounding from overflowing
)

// roundSize returns the size of the block that serves a request of n bytes.
// A zero-size request still gets a block of smallRound bytes, so that it
// has a distinct, valid address.
func roundSize(n int64) int64 {
	if n <= 0 {
		return smallRound
	}
	if n < smallLimit {
		return (n + smallRound - 1) / smallRound * smallRound
	}
	return (n + largeRound - 1) / largeRound * largeRound
}

// MemStats are the counters of a Device's caching allocator, in bytes or
// counts.
type MemStats struct {
	InUse     int64 // bytes in blocks handed out by Alloc and not yet freed
	Peak      int64 // highest InUse since the Device opened or ResetPeak
	Reserved  int64 // bytes obtained from the driver: InUse plus the cache
	Allocs    int64 // Alloc calls that succeeded
	Frees     int64 // Free calls
	CacheHits int64 // Allocs served from the cache
	RawAllocs int64 // Allocs that reached the driver (cuMemAlloc)
}

// Cached is the number of reserved bytes held in the cache, free for reuse.
func (s MemStats) Cached() int64 { return s.Reserved - s.InUse }

// Fragmentation is the share of reserved memory not in use: 1 - InUse/Reserved
// (0 when nothing is reserved).
func (s MemStats) Fragmentation() float64 {
	if s.Reserved == 0 {
		return 0
	}
	return 1 - float64(s.InUse)/float64(s.Reserved)
}

// rawAllocator is what the caching allocator gets memory from: cuMemAlloc and
// cuMemFree on a device, a fake in tests. Addresses must be 256-byte aligned.
type rawAllocator interface {
	alloc(n int64) (Ptr, error)
	free(p Ptr) error
}

// OutOfMemoryError reports an allocation that failed even after the cache
// was released (and Options.OnPressure ran).
type OutOfMemoryError struct {
	Requested int64 // bytes asked for
	Block     int64 // the rounded block size that was needed
	InUse     int64
	Peak      int64
	Cached    int64 // cached bytes at the time of the request (released before the retry)
	Limit     int64 // cap on reserved bytes (Options.MemoryFraction of Total)
	Total     int64 // device memory
	Cause     error // the driver's error, or nil when the limit refused it
}

func (e *OutOfMemoryError) Error() string {
	cause := fmt.Sprintf("the limit of %s (memory fraction of %s device memory) would be exceeded", human(e.Limit), human(e.Total))
	if e.Cause != nil {
		cause = e.Cause.Error()
	}
	return fmt.Sprintf("cuda: out of device memory allocating %s (%d bytes, block %s): %s; in use %s, peak %s, cached %s (released and retried), device total %s, limit %s; lower --micro-batch-size, or use --recompute-granularity",
		human(e.Requested), e.Requested, human(e.Block), cause, human(e.InUse), human(e.Peak), human(e.Cached), human(e.Total), human(e.Limit))
}

func (e *OutOfMemoryError) Unwrap() error { return e.Cause }

// errOverLimit is what rawAllocLocked returns when the limit refuses a block.
var errOverLimit = errors.New("over the memory limit")

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// cachingAllocator keeps freed blocks in per-size free lists and hands them
// out again. It never splits or merges blocks: a request takes a cached
// block of its rounded size, or else the smallest cached block of at most
// twice that size, or else a new block from the raw allocator. Free only
// touches the lists under the mutex, so it may run on any goroutine
// (finalizers) without calling the driver.
type cachingAllocator struct {
	raw        rawAllocator
	limit      int64  // cap on Reserved; <= 0 means no cap
	total      int64  // device memory, for error messages
	onPressure func() // called, outside mu, before the cache is released for a retry

	mu     sync.Mutex
	cached map[int64][]Ptr // rounded size -> free blocks of that size (maybe none)
	sizes  []int64         // sorted sizes whose list in cached is not empty
	live   map[Ptr]int64   // block handed out -> its size
	stats  MemStats
}

func newCachingAllocator(raw rawAllocator, limit, total int64, onPressure func()) *cachingAllocator {
	return &cachingAllocator{
		raw: raw, limit: limit, total: total, onPressure: onPressure,
		cached: make(map[int64][]Ptr),
		live:   make(map[Ptr]int64),
	}
}

// Alloc returns a block of at least n bytes.
func (a *cachingAllocator) Alloc(n int64) (Ptr, error) {
	if n < 0 || n > maxAlloc {
		return 0, fmt.Errorf("cuda: allocation of %d bytes: want a size from 0 to %d", n, int64(maxAlloc))
	}
	size := roundSize(n)
	a.mu.Lock()
	if p, ok := a.takeCachedLocked(size); ok {
		a.mu.Unlock()
		return p, nil
	}
	p, err := a.rawAllocLocked(size)
	if err == nil {
		a.mu.Unlock()
		return p, nil
	}
	a.mu.Unlock()

	// Memory pressure: let the caller's hook return memory (finalizers that
	// call Free), then release the whole cache back to the driver and retry.
	if a.onPressure != nil {
		a.onPressure()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.takeCachedLocked(size); ok {
		return p, nil
	}
	cached := a.stats.Reserved - a.stats.InUse
	releaseErr := a.releaseCachedLocked()
	p, err = a.rawAllocLocked(size)
	if err == nil {
		return p, nil
	}
	oom := &OutOfMemoryError{
		Requested: n, Block: size, InUse: a.stats.InUse, Peak: a.stats.Peak, Cached: cached,
		Limit: a.limit, Total: a.total,
	}
	if !errors.Is(err, errOverLimit) {
		oom.Cause = err
	}
	if releaseErr != nil {
		oom.Cause = errors.Join(oom.Cause, fmt.Errorf("releasing the cache: %w", releaseErr))
	}
	return 0, oom
}

// takeCachedLocked finds a cached block for a request of the given rounded
// size: an exact size, else the smallest block of at most twice the size.
func (a *cachingAllocator) takeCachedLocked(size int64) (Ptr, bool) {
	i := sort.Search(len(a.sizes), func(i int) bool { return a.sizes[i] >= size })
	if i == len(a.sizes) || a.sizes[i] > 2*size {
		return 0, false
	}
	got := a.sizes[i]
	list := a.cached[got]
	p := list[len(list)-1]
	// An emptied list stays in the map (keeping its capacity for the next
	// Free) but leaves sizes.
	a.cached[got] = list[:len(list)-1]
	if len(list) == 1 {
		a.sizes = append(a.sizes[:i], a.sizes[i+1:]...)
	}
	a.live[p] = got
	a.stats.InUse += got
	a.stats.Peak = max(a.stats.Peak, a.stats.InUse)
	a.stats.Allocs++
	a.stats.CacheHits++
	return p, true
}

func (a *cachingAllocator) rawAllocLocked(size int64) (Ptr, error) {
	if a.limit > 0 && a.stats.Reserved+size > a.limit {
		return 0, errOverLimit
	}
	p, err := a.raw.alloc(size)
	if err != nil {
		return 0, err
	}
	if _, dup := a.live[p]; dup {
		panic(fmt.Sprintf("cuda: the driver returned address %#x that is already in use", uintptr(p)))
	}
	a.live[p] = size
	a.stats.Reserved += size
	a.stats.InUse += size
	a.stats.Peak = max(a.stats.Peak, a.stats.InUse)
	a.stats.Allocs++
	a.stats.RawAllocs++
	return p, nil
}

// Free returns a block to the cache. Free(0) does nothing. Freeing an
// address Alloc did not return (or freeing twice) is a programming error
// and panics.
func (a *cachingAllocator) Free(p Ptr) {
	if p == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	size, ok := a.live[p]
	if !ok {
		panic(fmt.Sprintf("cuda: Free(%#x): not an allocated block (freed twice, or not from Alloc)", uintptr(p)))
	}
	delete(a.live, p)
	a.stats.InUse -= size
	a.stats.Frees++
	list := a.cached[size]
	if len(list) == 0 {
		i := sort.Search(len(a.sizes), func(i int) bool { return a.sizes[i] >= size })
		a.sizes = append(a.sizes, 0)
		copy(a.sizes[i+1:], a.sizes[i:])
		a.sizes[i] = size
	}
	a.cached[size] = append(list, p)
}

// EmptyCache returns every cached block to the raw allocator.
func (a *cachingAllocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.releaseCachedLocked()
}

func (a *cachingAllocator) releaseCachedLocked() error {
	var errs []error
	for size, list := range a.cached {
		for _, p := range list {
			if err := a.raw.free(p); err != nil {
				errs = append(errs, err)
			}
			a.stats.Reserved -= size
		}
		delete(a.cached, size)
	}
	a.sizes = a.sizes[:0]
	return errors.Join(errs...)
}

// Stats returns a snapshot of the counters.
func (a *cachingAllocator) Stats() MemStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// ResetPeak sets Peak to the current InUse.
func (a *cachingAllocator) ResetPeak() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Peak = a.stats.InUse
}
