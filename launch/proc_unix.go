//go:build unix

package launch

import (
	"os"
	"os/exec"
	"syscall"
)

// sigTerm is the signal that asks a worker to stop.
var sigTerm os.Signal = syscall.SIGTERM

// sigKill is the signal that ends a worker.
var sigKill os.Signal = syscall.SIGKILL

// ownProcessGroup puts the worker in its own process group, so that a
// terminal's Ctrl-C reaches it once (forwarded by the launcher) and a stop
// reaches any processes it started. Where the system allows, the worker is
// also killed when the launcher dies.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
}

// signalProcess sends sig to the worker's process group.
func signalProcess(cmd *exec.Cmd, sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok && cmd.Process != nil {
		if syscall.Kill(-cmd.Process.Pid, s) == nil {
			return
		}
	}
	if cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// killProcess sends SIGKILL to the worker's process group.
func killProcess(cmd *exec.Cmd) { signalProcess(cmd, syscall.SIGKILL) }

// exitSignal names the signal that ended the process, or "".
func exitSignal(ee *exec.ExitError) string {
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return ""
}

// closeOnExec keeps fd from the worker's own child processes.
func closeOnExec(fd int) { syscall.CloseOnExec(fd) }
