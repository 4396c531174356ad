package affinity

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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

// affords is how many moves the schedule has left: its count, or its time
// left at perMove a move.
func (sc *schedule) affords(perMove time.Duration) float64 {
	if sc.moves > 0 {
		return float64(sc.moves - sc.done)
	}
	left := time.Until(sc.end)
	if left <= 0 {
		return 0
	}
	return float64(left) / float64(max(perMove, 1))
}

// progress is how far along the schedule is, in [0, 1].
func (sc *schedule) progress() float64 {
	if sc.stop {
		return 1
	}
	if sc.moves > 0 {
		return min(1, float64(sc.done)/float64(sc.moves))
	}
	span := sc.end.Sub(sc.start)
	if span <= 0 {
		return 1
	}
	return min(1, float64(time.Since(sc.start))/float64(span))
}

// blockRound runs round r of a search over L layers cut into W blocks of
// consecutive layers: fn(w, i, lo, hi) searches block w's layers [lo, hi)
// on goroutine i of procs and reports whether w's schedule has ended
// (done[w]; ended blocks are skipped). Each block but the last leaves out
// its last gap layers, so that layers of different blocks searched at
// once are more than gap apart, and the cuts shift by one layer a round
// (the shift runs over every position of a block, so each layer is left
// out gap times in width rounds). Blocks in a round touch disjoint
// layers, so the result depends on the blocks, not on procs.
func blockRound(L, W, procs, r, gap int, done []bool, fn func(w, i, lo, hi int) bool) {
	width := L / W
	shift := 0
	if W > 1 {
		shift = r % width
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for i := range max(1, min(procs, W)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				w := int(next.Add(1)) - 1
				if w >= W {
					return
				}
				if done[w] {
					continue
				}
				lo, hi := w*width-shift, (w+1)*width-shift-gap
				if w == 0 {
					lo = 0
				}
				if w == W-1 {
					hi = L
				}
				done[w] = fn(w, i, lo, max(lo, hi))
			}
		}()
	}
	wg.Wait()
}

// blockSchedules returns the schedules of a block search over L layers
// (blockRound), blocks of at least minWidth layers: by time one block per
// goroutine of procs, each with lim's deadline; by work as many as the
// layers allow, whatever the machine, each with its share of the work
// (perUnit moves a unit), so that the plan does not depend on how many
// cores ran them.
func blockSchedules(ctx context.Context, lim task.Limit, procs, L, minWidth int, perUnit int64) []*schedule {
	W := max(1, min(procs, L/minWidth))
	if lim.ByWork() {
		W = max(1, L/minWidth)
	}
	scs := make([]*schedule, W)
	for w := range scs {
		wl := lim
		if lim.ByWork() {
			wl.Work = max(lim.Work/int64(W), 1)
		}
		scs[w] = newSchedule(ctx, wl, perUnit)
	}
	return scs
}

// runLayers spends a block's turn on its layers [lo, hi): hi − lo times a
// layer drawn by rng, and in it run steps, each given the schedule's
// progress, while sc lasts (a run in one layer reads its arrays while
// they are in cache). It reports whether sc has ended.
func (sc *schedule) runLayers(rng *rand.Rand, lo, hi, run int, step func(l int, p float64)) bool {
	for range hi - lo {
		l := lo + rng.IntN(hi-lo)
		for range run {
			p, ok := sc.next()
			if !ok {
				return true
			}
			step(l, p)
		}
	}
	return false
}
