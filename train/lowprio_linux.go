package train

import (
	"runtime"
	"sync"
	"syscall"
)

// lowerWriterPriority locks the calling goroutine to its OS thread and
// gives that thread the lowest CPU priority (nice 19): a background
// checkpoint writer's work (the snapshot copy, checksums, the kernel side
// of its writes) then runs when training leaves a core idle instead of
// preempting a training thread, which its peers would wait for at the
// kernel's end. The thread is never unlocked, so it exits with the
// goroutine and its priority with it.
func lowerWriterPriority() {
	runtime.LockOSThread()
	syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19) // best effort
}

// writerProcs counts the background writers holding an extra Go processor
// (several trainers may share a process: goroutine ranks).
var writerProcs struct {
	sync.Mutex
	n, base int
}

// addWriterProc raises GOMAXPROCS by one while a background writer runs and
// returns the function that takes it back. With every processor running
// training kernels (GOMAXPROCS = kernel threads, the default), a writer
// holding a processor (while it copies, checksums, or sits in a write
// syscall until the runtime takes the processor back) leaves a kernel
// thread without one, and the other waits for it at the kernel's end; with
// its own, the writer is just a nice-19 thread the OS runs when a core is
// idle.
func addWriterProc() (release func()) {
	writerProcs.Lock()
	if writerProcs.n == 0 {
		writerProcs.base = runtime.GOMAXPROCS(0)
	}
	writerProcs.n++
	runtime.GOMAXPROCS(writerProcs.base + writerProcs.n)
	writerProcs.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			writerProcs.Lock()
			writerProcs.n--
			runtime.GOMAXPROCS(writerProcs.base + writerProcs.n)
			writerProcs.Unlock()
		})
	}
}
