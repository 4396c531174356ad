//go:build !linux

package replay

import "time"

// threadTime falls back to wall-clock time where no per-thread CPU clock
// is reachable without cgo.
func threadTime() time.Duration { return wallTime() }
