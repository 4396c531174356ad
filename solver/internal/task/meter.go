package task

import (
	"context"
	"time"
)

// Meter bounds one piece of work, by the clock (a deadline) or by work (a
// number of units, such as moves scored). A search checks Done between
// steps and charges its steps with Spend; under a work budget the same
// inputs then stop at the same step on any machine, however loaded, which
// a deadline does not promise. A Meter is used by one goroutine.
type Meter struct {
	ctx      context.Context
	deadline time.Time
	left     int64 // units left under a work budget; −1 under a deadline
}

// ByTime returns a Meter that is done when ctx is or deadline has passed.
func ByTime(ctx context.Context, deadline time.Time) *Meter {
	return &Meter{ctx: ctx, deadline: deadline, left: -1}
}

// ByWork returns a Meter that is done when ctx is or units have been
// spent (units ≤ 0: at once).
func ByWork(ctx context.Context, units int64) *Meter {
	return &Meter{ctx: ctx, left: max(units, 0)}
}

// Work reports whether m counts work rather than time.
func (m *Meter) Work() bool { return m.left >= 0 }

// Done reports whether the work should stop.
func (m *Meter) Done() bool {
	if m.ctx.Err() != nil {
		return true
	}
	if m.left >= 0 {
		return m.left == 0
	}
	return !time.Now().Before(m.deadline)
}

// Spend charges n units (under a deadline it does nothing).
func (m *Meter) Spend(n int64) {
	if m.left > 0 {
		m.left = max(m.left-n, 0)
	}
}

// Left returns the units left, or −1 under a deadline.
func (m *Meter) Left() int64 { return m.left }

// Deadline returns the deadline (zero under a work budget).
func (m *Meter) Deadline() time.Time { return m.deadline }

// Until returns the time left before the deadline, or a day under a work
// budget (where only the work bounds it).
func (m *Meter) Until() time.Duration {
	if m.left >= 0 {
		return 24 * time.Hour
	}
	return time.Until(m.deadline)
}

// Limit is how much work a search may do: until Deadline, or when Work > 0
// that many units (moves scored), whatever the clock says.
type Limit struct {
	Deadline time.Time
	Work     int64
}

// Meter returns a fresh Meter for l.
func (l Limit) Meter(ctx context.Context) *Meter {
	if l.Work > 0 {
		return ByWork(ctx, l.Work)
	}
	return ByTime(ctx, l.Deadline)
}

// Share returns l with Work divided by n (at least 1 unit): one of n parts
// of a work budget, so that each part's stop does not depend on how fast
// the others ran. A deadline is shared as it is.
func (l Limit) Share(n int) Limit {
	if l.Work > 0 {
		l.Work = max(1, l.Work/int64(max(n, 1)))
	}
	return l
}

// ByWork reports whether l counts work.
func (l Limit) ByWork() bool { return l.Work > 0 }
