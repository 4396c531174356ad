package replay

import "time"

var epoch = time.Now()

// wallTime is a monotonic clock reading relative to package start.
func wallTime() time.Duration { return time.Since(epoch) }
