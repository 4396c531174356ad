package affinity

import (
	"context"
	"time"

	"github.com/moetuner/moetuner/solver/internal/task"
)

// coolTo is where an annealing's temperature ends, as a fraction of where
// it starts (the mean |Δ| of random moves): at a ten-thousandth only moves
// within a rounding of zero are still accepted uphill, so the last part
// of every schedule is a descent.
const coolTo = 1e-4

// schedule tells an annealing how far along it is: by the clock towards a
// deadline, or by moves towards a count (work budgets, which make the run
// the same on any machine).
type schedule struct {
	ctx   context.Context
	start time.Time
	end   time.Time
	moves int64 // > 0: count moves
	done  int64
	p     float64
	stop  bool
}

// newSchedule returns a schedule for lim: its moves when it counts work
// (scaled by perUnit moves per work unit), else its deadline.
func newSchedule(ctx context.Context, lim task.Limit, perUnit int64) *schedule {
	sc := &schedule{ctx: ctx, start: time.Now(), end: lim.Deadline}
	if lim.ByWork() {
		sc.moves = max(lim.Work*perUnit, 1)
	}
	return sc
}

// next counts one move and returns the progress in [0, 1), or false when
// the schedule is over (or ctx is done).
func (sc *schedule) next() (float64, bool) {
	if sc.stop {
		return 1, false
	}
	sc.done++
	if sc.moves > 0 {
		if sc.done > sc.moves || (sc.done&1023 == 0 && sc.ctx.Err() != nil) {
			sc.stop = true
			return 1, false
		}
		return float64(sc.done-1) / float64(sc.moves), true
	}
	if sc.done&63 == 1 {
		now := time.Now()
		if !now.Before(sc.end) || sc.ctx.Err() != nil {
			sc.stop = true
			return 1, false
		}
		sc.p = float64(now.Sub(sc.start)) / float64(sc.end.Sub(sc.start))
	}
	return sc.p, true
}
