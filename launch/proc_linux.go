package launch

import "syscall"

// setParentDeathSignal makes Linux send SIGKILL to the worker when the
// launcher dies (even by SIGKILL), so no worker outlives it. Linux ties this
// to the OS thread that started the worker; the launcher never locks
// goroutines to threads, and the Go runtime only retires threads of locked
// goroutines, so the thread lives as long as the launcher.
func setParentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
