package cpu

import (
	"runtime"
	"sync"
	"time"
)

// FMAPeak measures the fp32 multiply-add rate, in GFLOP/s (2 per
// multiply-add), that threads goroutines reach together in register-only
// FMA loops of the active ISA's width, run concurrently for about d. It is
// the ceiling a GEMM on as many threads can approach on this machine, now:
// it reflects the clock, how the hypervisor places the vCPUs (two vCPUs on
// one physical core share its FMA units) and the CPU share other processes
// leave, so a benchmark that divides by it, measured in the same run, checks
// efficiency rather than the load. threads < 1 counts as 1; d is at least
// 1ms.
func FMAPeak(threads int, d time.Duration) float64 {
	threads = max(threads, 1)
	d = max(d, time.Millisecond)
	loop, flopsPerIter := peakLoopFor(ActiveISA())
	type span struct {
		start, end time.Time
		iters      int
	}
	spans := make([]span, threads)
	deadline := time.Now().Add(d)
	run := func(s *span) {
		// Keep the goroutine on one OS thread for the whole window, like
		// a GEMM part that is running.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		s.start = time.Now()
		for {
			loop(peakChunk)
			s.iters += peakChunk
			if s.end = time.Now(); !s.end.Before(deadline) {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < threads; i++ {
		wg.Go(func() { run(&spans[i]) })
	}
	run(&spans[0])
	wg.Wait()
	// All FLOPs over the union of the windows: a goroutine the OS starts
	// late lowers the figure, as it would slow a GEMM.
	first, last, iters := spans[0].start, spans[0].end, 0
	for _, s := range spans {
		if s.start.Before(first) {
			first = s.start
		}
		if s.end.After(last) {
			last = s.end
		}
		iters += s.iters
	}
	return float64(iters) * flopsPerIter / last.Sub(first).Seconds() / 1e9
}

// peakChunk is the iterations per call of a peak loop: tens of
// microseconds, so the clock is read rarely but the window ends close to d.
const peakChunk = 2048

// fmaLoopGo is the pure-Go peak loop: n iterations of eight independent
// multiply-add chains (16 FLOPs each; the compiler may or may not fuse
// them, which is the generic path's real rate either way). It returns lane
// 0 of the chains' sum, 8·n, like the assembly loops.
func fmaLoopGo(n int) float32 {
	one := float32(1)
	var a0, a1, a2, a3, a4, a5, a6, a7 float32
	for range n {
		a0 = a0 + one*one
		a1 = a1 + one*one
		a2 = a2 + one*one
		a3 = a3 + one*one
		a4 = a4 + one*one
		a5 = a5 + one*one
		a6 = a6 + one*one
		a7 = a7 + one*one
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7
}
