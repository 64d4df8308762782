//go:build unix && !linux

package launch

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal.
func setParentDeathSignal(attr *syscall.SysProcAttr) {}
