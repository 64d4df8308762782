package cuda

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

// fakeMemory is a raw allocator over a pretend address space of cap bytes.
type fakeMemory struct {
	mu     sync.Mutex
	next   Ptr
	used   int64
	cap    int64
	live   map[Ptr]int64
	allocs int
	frees  int
}

func newFakeMemory(capacity int64) *fakeMemory {
	return &fakeMemory{next: 1 << 20, cap: capacity, live: map[Ptr]int64{}}
}

func (f *fakeMemory) alloc(n int64) (Ptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.used+n > f.cap {
		return 0, &Error{Op: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	p := f.next
	f.next += Ptr((n + 4095) / 4096 * 4096)
	f.used += n
	f.live[p] = n
	f.allocs++
	return p, nil
}

func (f *fakeMemory) free(p Ptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.live[p]
	if !ok {
		return errors.New("fake: free of unknown block")
	}
	delete(f.live, p)
	f.used -= n
	f.frees++
	return nil
}

func TestRoundSize(t *testing.T) {
	for _, c := range []struct{ n, want int64 }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {1<<20 - 1, 1 << 20},
		{1 << 20, 2 << 20}, {2 << 20, 2 << 20}, {2<<20 + 1, 4 << 20}, {5 << 20, 6 << 20},
	} {
		if got := roundSize(c.n); got != c.want {
			t.Errorf("roundSize(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

func TestAllocatorReuseAndStats(t *testing.T) {
	raw := newFakeMemory(1 << 30)
	a := newCachingAllocator(raw, 0, 1<<30, nil)
	p1, err := a.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	if uintptr(p1)%256 != 0 {
		t.Errorf("address %#x not 256-byte aligned", uintptr(p1))
	}
	p2, _ := a.Alloc(3 << 20)
	s := a.Stats()
	if s.InUse != 1024+4<<20 || s.Reserved != s.InUse || s.RawAllocs != 2 || s.Allocs != 2 || s.CacheHits != 0 {
		t.Fatalf("after two allocs: %+v", s)
	}
	a.Free(p1)
	a.Free(p2)
	s = a.Stats()
	if s.InUse != 0 || s.Reserved != 1024+4<<20 || s.Peak != 1024+4<<20 || s.Frees != 2 {
		t.Fatalf("after frees: %+v", s)
	}
	if f := s.Fragmentation(); f != 1 {
		t.Errorf("fragmentation with everything cached = %g, want 1", f)
	}
	// Same size classes come back from the cache, without the raw allocator.
	q1, _ := a.Alloc(600)
	q2, _ := a.Alloc(4 << 20)
	if q1 != p1 || q2 != p2 {
		t.Errorf("cache not reused: got %#x %#x, want %#x %#x", q1, q2, p1, p2)
	}
	s = a.Stats()
	if s.CacheHits != 2 || s.RawAllocs != 2 || raw.allocs != 2 {
		t.Errorf("cache hits %d raw %d (fake %d), want 2 2 2", s.CacheHits, s.RawAllocs, raw.allocs)
	}
	// A smaller request takes a cached block at most twice its size...
	a.Free(q2)
	r, _ := a.Alloc(2<<20 + 1) // rounds to 4 MiB: exact
	if r != p2 {
		t.Errorf("exact class not reused")
	}
	a.Free(r)
	r, _ = a.Alloc(2 << 20) // 2 MiB: the 4 MiB block is within 2x
	if r != p2 {
		t.Errorf("best fit within 2x not reused")
	}
	if s := a.Stats(); s.InUse != 1024+4<<20 {
		t.Errorf("in use counts the whole block: %d", s.InUse)
	}
	a.Free(r)
	// ...but not one more than twice its size.
	r, _ = a.Alloc(512)
	if r == p2 {
		t.Errorf("a 4 MiB block served a 512 B request")
	}
	if got := a.Stats().Fragmentation(); got <= 0 || got >= 1 {
		t.Errorf("fragmentation %g, want in (0, 1)", got)
	}
	a.Free(r)
	a.Free(q1)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Reserved != 0 || len(raw.live) != 0 {
		t.Errorf("after EmptyCache reserved %d, fake holds %d blocks", s.Reserved, len(raw.live))
	}
}

func TestAllocatorZeroSizeAndPeak(t *testing.T) {
	a := newCachingAllocator(newFakeMemory(1<<30), 0, 1<<30, nil)
	p, err := a.Alloc(0)
	q, err2 := a.Alloc(0)
	if err != nil || err2 != nil || p == 0 || q == 0 || p == q {
		t.Fatalf("zero-size allocs: %#x %v, %#x %v: want two distinct valid blocks", p, err, q, err2)
	}
	if _, err := a.Alloc(-1); err == nil {
		t.Errorf("negative size accepted")
	}
	if _, err := a.Alloc(1<<63 - 1); err == nil {
		t.Errorf("absurd size accepted")
	}
	big, _ := a.Alloc(10 << 20)
	a.Free(big)
	if s := a.Stats(); s.Peak != 1024+10<<20 || s.InUse != 1024 {
		t.Errorf("peak %d in use %d", s.Peak, s.InUse)
	}
	a.ResetPeak()
	if s := a.Stats(); s.Peak != 1024 {
		t.Errorf("after ResetPeak peak = %d, want 1024", s.Peak)
	}
	a.Free(0) // no-op
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("double free did not panic")
			}
		}()
		a.Free(p)
		a.Free(p)
	}()
}

func TestAllocatorReleasesCacheAndRetries(t *testing.T) {
	raw := newFakeMemory(10 << 20)
	pressure := 0
	a := newCachingAllocator(raw, 0, 10<<20, func() { pressure++ })
	p, _ := a.Alloc(6 << 20)
	a.Free(p) // 6 MiB cached; 4 MiB left in the fake
	q, err := a.Alloc(8 << 20)
	if err != nil {
		t.Fatalf("alloc after release: %v", err)
	}
	if pressure != 1 {
		t.Errorf("OnPressure called %d times, want 1", pressure)
	}
	if s := a.Stats(); s.Reserved != 8<<20 || s.InUse != 8<<20 || raw.frees != 1 {
		t.Errorf("after release and retry: %+v, fake frees %d", s, raw.frees)
	}
	_, err = a.Alloc(4 << 20)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("want *OutOfMemoryError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"4.0 MiB", "in use 8.0 MiB", "peak 8.0 MiB", "cached 0 B", "device total 10.0 MiB",
		"CUDA_ERROR_OUT_OF_MEMORY", "--micro-batch-size", "--recompute-granularity"} {
		if !strings.Contains(msg, want) {
			t.Errorf("OOM error %q lacks %q", msg, want)
		}
	}
	a.Free(q)
}

// OnPressure may free blocks (as finalizers do); the retry then uses them.
func TestAllocatorOnPressureFrees(t *testing.T) {
	raw := newFakeMemory(8 << 20)
	var held Ptr
	a := newCachingAllocator(raw, 0, 8<<20, nil)
	a.onPressure = func() { a.Free(held); held = 0 }
	held, _ = a.Alloc(8 << 20)
	p, err := a.Alloc(6 << 20)
	if err != nil {
		t.Fatalf("alloc after OnPressure freed: %v", err)
	}
	if s := a.Stats(); s.InUse != 8<<20 || s.CacheHits != 1 {
		t.Errorf("want the freed 8 MiB block reused: %+v", s)
	}
	a.Free(p)
}

func TestAllocatorMemoryFractionCap(t *testing.T) {
	raw := newFakeMemory(100 << 20)
	a := newCachingAllocator(raw, 9<<20, 10<<20, nil)
	p, err := a.Alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(2 << 20)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || oom.Cause != nil || !strings.Contains(err.Error(), "limit of 9.0 MiB") {
		t.Fatalf("want a limit error, got %v", err)
	}
	if raw.allocs != 1 {
		t.Errorf("the limit should refuse before the driver: %d raw allocs", raw.allocs)
	}
	a.Free(p)
}

func TestAllocatorConcurrentFree(t *testing.T) {
	a := newCachingAllocator(newFakeMemory(1<<40), 0, 1<<40, nil)
	const goroutines, per = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ps []Ptr
			for i := range per {
				p, err := a.Alloc(int64(512 * (1 + (g+i)%7)))
				if err != nil {
					t.Error(err)
					return
				}
				ps = append(ps, p)
			}
			// Free from other goroutines, as finalizers would.
			var fw sync.WaitGroup
			for _, p := range ps {
				fw.Add(1)
				go func() { defer fw.Done(); a.Free(p) }()
			}
			fw.Wait()
		}()
	}
	wg.Wait()
	s := a.Stats()
	if s.InUse != 0 || s.Allocs != goroutines*per || s.Frees != goroutines*per {
		t.Errorf("after concurrent alloc/free: %+v", s)
	}
}
