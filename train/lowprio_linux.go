package train

import (
	"runtime"
	"syscall"
)

// lowerWriterPriority locks the calling goroutine to its OS thread and
// gives that thread the lowest CPU priority (nice 19): a background
// checkpoint writer's kernel work (copying into the page cache) then runs
// when training leaves a core idle instead of preempting a training thread,
// which its peers would wait for at the kernel's end. The thread is never
// unlocked, so it exits with the goroutine and its priority with it.
func lowerWriterPriority() {
	runtime.LockOSThread()
	syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19) // best effort
}
