//go:build unix

package placement

import (
	"errors"
	"syscall"
)

// processExists reports whether a process with this pid runs (or exists
// but belongs to another user): only ESRCH from kill(pid, 0) says it does
// not.
func processExists(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
