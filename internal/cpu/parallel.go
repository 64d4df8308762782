package cpu

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

// threads is the number of goroutines kernels split work over. It is process
// state by nature (like GOMAXPROCS): read from GOTRON_NUM_THREADS at start-up,
// changed only through SetThreads.
var threads atomic.Int32

func init() {
	n := runtime.GOMAXPROCS(0)
	if s := os.Getenv("GOTRON_NUM_THREADS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			n = v
		}
	}
	threads.Store(int32(n))
}

// Threads returns the number of goroutines kernels use.
func Threads() int { return int(threads.Load()) }

// SetThreads sets the number of goroutines kernels use (n < 1 means 1) and
// returns the previous value.
func SetThreads(n int) int {
	if n < 1 {
		n = 1
	}
	return int(threads.Swap(int32(n)))
}

// Parallel splits [0, n) into at most Threads() contiguous chunks of at least
// grain items and calls fn on each, concurrently; it returns when all are
// done. With one chunk it runs fn on the calling goroutine.
func Parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := min(Threads(), (n+grain-1)/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	wg.Add(chunks - 1)
	for c := 1; c < chunks; c++ {
		lo, hi := c*n/chunks, (c+1)*n/chunks
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	fn(0, n/chunks)
	wg.Wait()
}
