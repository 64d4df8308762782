package cpu

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// sink is a tiny elementwise kernel, stored once as a method value so that
// calling Parallel with it allocates nothing on the caller's side.
type sink struct{ x []float32 }

func (s *sink) add(lo, hi int) {
	for i := lo; i < hi; i++ {
		s.x[i]++
	}
}

// BenchmarkParallelOverhead measures one Parallel call on a small
// elementwise kernel (n items, grain 1 so every thread gets a chunk): the
// fixed cost of handing chunks out and waiting for them.
func BenchmarkParallelOverhead(b *testing.B) {
	for _, n := range []int{64, 4096} {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("n=%d/threads=%d", n, th), func(b *testing.B) {
				defer SetThreads(SetThreads(th))
				s := &sink{x: make([]float32, n)}
				fn := s.add
				b.ReportAllocs()
				for b.Loop() {
					Parallel(n, 1, fn)
				}
			})
		}
	}
}

// TestParallelChunks checks, for a table of sizes, grains and thread
// counts, that every index is visited exactly once and that the chunks are
// exactly the documented ones: [c·n/chunks, (c+1)·n/chunks) for
// chunks = min(threads, ceil(n/grain)).
func TestParallelChunks(t *testing.T) {
	for _, tc := range []struct{ n, grain, threads, chunks int }{
		{0, 1, 4, 0}, {-3, 1, 4, 0}, {1, 1, 4, 1}, {5, 0, 4, 4}, {5, 1, 4, 4},
		{10, 3, 8, 4}, {10, 10, 8, 1}, {100, 1, 3, 3}, {1000, 7, 16, 16}, {7, 2, 2, 2},
	} {
		t.Run(fmt.Sprintf("n=%d/grain=%d/threads=%d", tc.n, tc.grain, tc.threads), func(t *testing.T) {
			defer SetThreads(SetThreads(tc.threads))
			hits := make([]atomic.Int32, max(tc.n, 0))
			var mu sync.Mutex
			got := map[[2]int]bool{}
			Parallel(tc.n, tc.grain, func(lo, hi int) {
				mu.Lock()
				got[[2]int{lo, hi}] = true
				mu.Unlock()
				for i := lo; i < hi; i++ {
					hits[i].Add(1)
				}
			})
			for i := range hits {
				if h := hits[i].Load(); h != 1 {
					t.Fatalf("index %d visited %d times, want 1", i, h)
				}
			}
			want := map[[2]int]bool{}
			for c := range tc.chunks {
				want[[2]int{c * tc.n / tc.chunks, (c + 1) * tc.n / tc.chunks}] = true
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("chunks %v, want %v", got, want)
			}
		})
	}
}

// TestParallelAllocs checks that a Parallel call allocates nothing in
// steady state, at one thread and at several (workers in use).
func TestParallelAllocs(t *testing.T) {
	for _, th := range []int{1, 2, 4} {
		func() {
			defer SetThreads(SetThreads(th))
			s := &sink{x: make([]float32, 1<<12)}
			fn := s.add
			Parallel(len(s.x), 1, fn) // warm: start workers, fill the free list
			if a := testing.AllocsPerRun(200, func() { Parallel(len(s.x), 1, fn) }); a != 0 {
				t.Errorf("threads=%d: %v allocs per call, want 0", th, a)
			}
			for i, v := range s.x {
				if v != s.x[0] || v < 200 {
					t.Fatalf("threads=%d: x[%d]=%v, x[0]=%v: some chunk was skipped or repeated", th, i, v, s.x[0])
				}
			}
		}()
	}
}

// TestParallelConcurrentNested runs many goroutines (like tensor-parallel
// ranks), each calling Parallel whose chunks call Parallel again, with more
// chunks than workers; every element must be updated exactly the expected
// number of times and nothing may deadlock. Run it under -race.
func TestParallelConcurrentNested(t *testing.T) {
	defer SetThreads(SetThreads(4))
	const callers, rounds, outer, inner = 6, 30, 8, 64
	var wg sync.WaitGroup
	bufs := make([][]int32, callers)
	for r := range bufs {
		bufs[r] = make([]int32, outer*inner)
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := bufs[r]
			for range rounds {
				Parallel(outer, 1, func(lo, hi int) {
					for o := lo; o < hi; o++ {
						row := x[o*inner : (o+1)*inner]
						Parallel(inner, 4, func(a, b int) {
							for i := a; i < b; i++ {
								row[i]++
							}
						})
					}
				})
			}
		}()
	}
	wg.Wait()
	for r, x := range bufs {
		for i, v := range x {
			if v != rounds {
				t.Fatalf("caller %d: x[%d]=%d, want %d", r, i, v, rounds)
			}
		}
	}
}

// blockJob is a pool job whose parts block until release is closed.
type blockJob struct {
	cr      crew
	entered *sync.WaitGroup
	release chan struct{}
}

func (b *blockJob) crew() *crew { return &b.cr }

func (b *blockJob) runPart(int) {
	b.entered.Done()
	<-b.release
}

// TestParallelBlockedWorkers makes every pool worker block inside a task,
// then calls Parallel: the call must complete on its caller alone rather
// than wait for the tasks it queued.
func TestParallelBlockedWorkers(t *testing.T) {
	workers.ensure(2)
	nw := int(workers.started.Load())
	defer SetThreads(SetThreads(nw + 1)) // no new workers are started
	var entered sync.WaitGroup
	entered.Add(nw)
	b := &blockJob{entered: &entered, release: make(chan struct{})}
	gen := b.cr.open()
	for p := range nw {
		workers.tasks <- poolTask{b, gen, p} // blocking: each reaches a worker
	}
	entered.Wait() // a blocked worker takes no second task: all are busy
	var sum atomic.Int64
	Parallel(100, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	close(b.release)
	b.cr.close()
	if s := sum.Load(); s != 100 {
		t.Errorf("covered %d items, want 100", s)
	}
}

// TestThreadsEnv checks that GOTRON_NUM_THREADS sets Threads at start-up,
// by running this test binary again with it set.
func TestThreadsEnv(t *testing.T) {
	if v := os.Getenv("GOTRON_TEST_WANT_THREADS"); v != "" {
		if v == "gomaxprocs" {
			v = strconv.Itoa(runtime.GOMAXPROCS(0))
		}
		if got := strconv.Itoa(Threads()); got != v {
			t.Fatalf("Threads()=%s with GOTRON_NUM_THREADS=%q, want %s", got, os.Getenv("GOTRON_NUM_THREADS"), v)
		}
		return
	}
	for _, tc := range []struct{ env, want string }{
		{"3", "3"}, {"1", "1"}, {"0", "gomaxprocs"}, {"x", "gomaxprocs"}, {"-2", "gomaxprocs"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestThreadsEnv$")
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS="+tc.env, "GOTRON_TEST_WANT_THREADS="+tc.want)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOTRON_NUM_THREADS=%s: %v\n%s", tc.env, err, out)
		}
	}
}
