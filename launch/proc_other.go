//go:build !unix

package launch

import (
	"os"
	"os/exec"
)

// sigTerm is the signal that asks a worker to stop; without Unix signals it
// is os.Interrupt.
var sigTerm = os.Interrupt

// sigKill is the signal that ends a worker.
var sigKill = os.Kill

func ownProcessGroup(cmd *exec.Cmd) {}

func signalProcess(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

func killProcess(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

func exitSignal(ee *exec.ExitError) string { return "" }

func closeOnExec(fd int) {}
