//go:build linux

package replay

import (
	"syscall"
	"time"
	"unsafe"
)

// clockThreadCPUTime is CLOCK_THREAD_CPUTIME_ID from <time.h>.
const clockThreadCPUTime = 3

// threadTime returns the CPU time consumed by the calling OS thread. The
// cpu backend locks its goroutine to a thread and times expert work with
// it, so time the thread spends preempted by other processes (tests run
// packages in parallel on two cores) does not count as expert time.
func threadTime() time.Duration {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return wallTime()
	}
	return time.Duration(ts.Nano())
}
