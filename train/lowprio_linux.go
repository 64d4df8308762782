package train

import (
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// lowerWriterPriority locks the calling goroutine to its OS thread and
// gives that thread the lowest CPU priority: the SCHED_IDLE policy, else
// nice 19. A background checkpoint writer's work (the snapshot copy,
// checksums, the kernel side of its writes) then runs when training leaves
// a core idle instead of preempting a training thread, which its peers
// would wait for at the kernel's end; under SCHED_IDLE a training thread
// that wakes up preempts it at once (a nice-19 thread may finish its time
// slice first). The thread is never unlocked, so it exits with the
// goroutine and its policy with it.
func lowerWriterPriority() {
	runtime.LockOSThread()
	tid := unix.Gettid()
	if unix.SchedSetAttr(tid, &unix.SchedAttr{Policy: unix.SCHED_IDLE, Nice: 19}, 0) == nil {
		return
	}
	syscall.Setpriority(syscall.PRIO_PROCESS, tid, 19) // best effort
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
// its own, the writer is just a lowest-priority thread the OS runs when a
// core is idle.
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
