// Package task holds how the solver's methods run their work: layers in
// parallel within a deadline, MIP solves checked row by row against the
// model (a backend is never trusted), and the infeasibility a method
// reports. The solver facade turns Infeasible into its public
// InfeasibleError.
package task

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/moetuner/moetuner/mip"
)

// Infeasible says which constraint made a problem infeasible and what
// would fix it.
type Infeasible struct {
	Constraint string
	Detail     string
}

// Error names the constraint and the fix.
func (e *Infeasible) Error() string {
	return "solver: infeasible: " + e.Constraint + ": " + e.Detail
}

// Layers runs fn(l, limit) for l = 0..L−1 on workers goroutines. Each
// layer's limit is a fair share of the time left before deadline: what
// remains, times the workers, over the layers not yet started, at least
// minLimit while that much is left before the deadline, and 0 past it (a
// layer then runs only its cheap first steps).
func Layers(L, workers int, deadline time.Time, minLimit time.Duration, fn func(l int, limit time.Duration)) {
	workers = max(workers, 1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	jobs := make(chan int)
	left := L
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range jobs {
				mu.Lock()
				limit := time.Until(deadline) * time.Duration(workers) / time.Duration(left)
				left--
				mu.Unlock()
				left := time.Until(deadline)
				fn(l, max(min(limit, left), min(minLimit, left), 0))
			}
		}()
	}
	for l := range L {
		jobs <- l
	}
	close(jobs)
	wg.Wait()
}

// Expired reports whether ctx is done or deadline has passed.
func Expired(ctx context.Context, deadline time.Time) bool {
	return ctx.Err() != nil || !time.Now().Before(deadline)
}

// MIPSettings are the backend settings every MIP of a solve shares.
type MIPSettings struct {
	RelGap  float64 // 0: exact (the backend's own default is not used)
	Threads int
	Seed    int
	// NodeLimit, under a work budget, caps each solve's branch-and-bound
	// nodes instead of the clock (0: time-limited). MaxCols then skips
	// models with more columns (an out-of-time result: the caller keeps
	// its start), since a node limit does not bound the root node's work
	// and only small models finish their root reproducibly fast.
	NodeLimit int
	MaxCols   int
}

// Sub is one MIP solve with its size.
type Sub struct {
	Sol                   *mip.Solution
	Cols, Ints, Rows, NNZ int
	Err                   error
}

// RunMIP solves m from start (nil: none) within limit (≤ 0: no solve: the
// start as a timed-out feasible solution, or without one an out-of-time
// result), or within s.NodeLimit nodes when that is set. The
// start is
// checked against every row first (an infeasible start is an internal
// error), a stop by the watchdog with an incumbent is a result, and the
// solution is checked against every row (an infeasible one is an error).
func RunMIP(ctx context.Context, backend mip.Backend, m *mip.Model, start []float64, s MIPSettings, limit time.Duration) Sub {
	var ss Sub
	ss.Cols, ss.Ints, ss.Rows, ss.NNZ = m.Size()
	if limit <= 0 && s.NodeLimit <= 0 && start != nil && m.Check(start, 1e-6) == nil {
		// No time left but a feasible start: that is the best solution
		// found by the deadline.
		ss.Sol = &mip.Solution{Status: mip.Feasible, X: start, Objective: m.Value(start), Bound: math.Inf(-1), Gap: math.Inf(1), TimedOut: true}
		return ss
	}
	if (limit <= 0 && s.NodeLimit <= 0) || (s.NodeLimit > 0 && s.MaxCols > 0 && ss.Cols > s.MaxCols) {
		// No time left (a backend's 0 would mean no limit at all), or a
		// model too large for a work budget.
		ss.Err = context.DeadlineExceeded
		return ss
	}
	gap := s.RelGap
	if gap == 0 {
		gap = 1e-12 // exact: the backend's 0 means its own default
	}
	mo := mip.Options{TimeLimitSec: limit.Seconds(), RelGap: gap, Threads: s.Threads, Seed: s.Seed, Start: start, NodeLimit: s.NodeLimit}
	if s.NodeLimit > 0 {
		mo.TimeLimitSec = 0 // the work bounds it, reproducibly
	}
	if start != nil {
		if err := m.Check(start, 1e-6); err != nil {
			ss.Err = fmt.Errorf("solver: internal error: warm start infeasible: %w", err)
			return ss
		}
	}
	ss.Sol, ss.Err = backend.Solve(ctx, m, mo)
	if ss.Err != nil && (errors.Is(ss.Err, context.DeadlineExceeded) || errors.Is(ss.Err, context.Canceled)) && ss.Sol != nil && ss.Sol.X != nil {
		// The watchdog or a cancel stopped a solve that had an incumbent:
		// a result with a gap, not an error.
		ss.Err = nil
		ss.Sol.TimedOut = true
		if ss.Sol.Status == mip.Optimal {
			ss.Sol.Status = mip.Feasible
		}
	}
	if ss.Err == nil && ss.Sol.X != nil {
		if err := m.Check(ss.Sol.X, 1e-5); err != nil {
			ss.Err = fmt.Errorf("solver: backend returned an infeasible solution: %w", err)
		}
	}
	return ss
}

// Tally sums the sizes and statuses of a method's MIP solves.
type Tally struct {
	Cols, Ints, Rows, NNZ int
	Solves                int
	AllOptimal, TimedOut  bool
}

// Add checks a finished solve (what ILP stopped the solve without an
// incumbent, or found no plan) and counts it; it returns the solution.
// what names the ILP in errors.
func (t *Tally) Add(ss Sub, what string) (*mip.Solution, error) {
	if ss.Err != nil {
		return nil, ss.Err
	}
	if err := Verdict(ss.Sol, what); err != nil {
		return nil, err
	}
	if t.Solves == 0 {
		t.AllOptimal = true
	}
	t.Solves++
	t.Cols += ss.Cols
	t.Ints += ss.Ints
	t.Rows += ss.Rows
	t.NNZ += ss.NNZ
	t.AllOptimal = t.AllOptimal && ss.Sol.Status == mip.Optimal
	t.TimedOut = t.TimedOut || ss.Sol.TimedOut
	return ss.Sol, nil
}

// Verdict turns a backend status without a usable solution into an error.
func Verdict(sol *mip.Solution, what string) error {
	switch sol.Status {
	case mip.Infeasible:
		return &Infeasible{Constraint: what, Detail: "no assignment meets the slot and capacity constraints; check experts per GPU"}
	case mip.NoSolution:
		return fmt.Errorf("solver: the %s stopped at its time limit without a feasible solution; raise the time limit", what)
	case mip.Error:
		return fmt.Errorf("solver: the MIP backend failed on the %s", what)
	}
	if sol.X == nil {
		return fmt.Errorf("solver: the MIP backend reported %s without a solution for the %s", sol.Status, what)
	}
	return nil
}

// OutOfTime reports whether a sub-solve ended without a plan because time
// ran out or the solve was stopped (as opposed to infeasibility or a
// failure), so that its caller can fall back to the start it gave.
func (ss Sub) OutOfTime() bool {
	if ss.Err != nil {
		return errors.Is(ss.Err, context.DeadlineExceeded) || errors.Is(ss.Err, context.Canceled)
	}
	return ss.Sol != nil && ss.Sol.X == nil && (ss.Sol.Status == mip.NoSolution || ss.Sol.TimedOut)
}
