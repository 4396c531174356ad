package solver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	. "github.com/moetuner/moetuner/solver"
)

// deadlineCase is one solve path: a problem and a strategy.
type deadlineCase struct {
	name     string
	problem  func(t *testing.T) Problem
	strategy Strategy
}

func deadlineCases() []deadlineCase {
	flameRep := func(nodes int, flow costmodel.Flow, slots int) func(t *testing.T) Problem {
		return func(t *testing.T) Problem {
			p := flameProblem(t, nodes, flow)
			p.RedundantSlots = slots
			return p
		}
	}
	mixtral := func(t *testing.T) Problem { return mixtralProblem(t) }
	var cases []deadlineCase
	for _, st := range []Strategy{StrategyJoint, StrategyMoETuner, StrategyGreedy, StrategyEPLB} {
		cases = append(cases,
			deadlineCase{"mixtral-1node/" + string(st), mixtral, st},
			deadlineCase{"flame-1node-home/" + string(st), flameRep(1, costmodel.FlowHome, 0), st},
			deadlineCase{"flame-2node-chain/" + string(st), flameRep(2, costmodel.FlowChain, 0), st},
			deadlineCase{"flame-2node-home-replicas/" + string(st), flameRep(2, costmodel.FlowHome, 8), st},
		)
	}
	return cases
}

// A solve given a deadline or a cancel at several points of every path
// (before it starts, within the first milliseconds while the start is
// built, and during the search) returns a valid plan whose cost
// recomputes, or, only when no plan can exist yet, an error that says the
// context ended; it never panics and it returns soon after the context
// ends even though its own time limit is a minute away.
func TestDeadlinesAndCancelsOnEveryPath(t *testing.T) {
	if testing.Short() {
		t.Skip("solves every path several times")
	}
	type stop struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}
	stops := []stop{
		{"cancelled-before", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}},
		{"deadline-1ms", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Millisecond)
		}},
		{"deadline-30ms", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}},
		{"cancel-at-300ms", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}},
	}
	for _, c := range deadlineCases() {
		t.Run(c.name, func(t *testing.T) {
			p := c.problem(t)
			for _, s := range stops {
				ctx, cancel := s.ctx()
				start := time.Now()
				res, err := Solve(ctx, p, Options{Strategy: c.strategy, TimeLimit: time.Minute})
				took := time.Since(start)
				ended := ctx.Err()
				cancel()
				what := fmt.Sprintf("%s %s after %v", c.name, s.name, took.Round(time.Millisecond))
				// A minute-long limit that the context did not cut would
				// show as a solve far past its context's end.
				assert.Less(t, took, 20*time.Second, what)
				if err != nil {
					assert.Nil(t, res, what)
					require.Error(t, ended, "%s: an error although the context had not ended: %v", what, err)
					assert.ErrorIs(t, err, ended, "%s: an error only because the context ended: %v", what, err)
					assert.Contains(t, err.Error(), "stopped before", "%s: the error says what stopped", what)
					continue
				}
				verify(t, p, res)
				t.Logf("%s: %s, objective %.6g", what, res.Status, res.Objective)
			}
		})
	}
}

// A library call with a 30 ms context deadline and zero Options on the
// DeepSeek-V3 counts (4 nodes × 8 GPUs, 32 redundant slots) returns a
// valid plan, at least as balanced as EPLB's.
func TestDeepSeek30msDeadlineZeroOptions(t *testing.T) {
	p := deepseekProblem(t, deepseekStats(t, "prefill_in4096"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	res, err := Solve(ctx, p, Options{})
	require.NoError(t, err)
	verify(t, p, res)
	eplb, err := Solve(context.Background(), p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	t.Logf("busiest/mean: 30 ms joint %.4f (%s), EPLB %.4f", res.Report.MeanBalance, res.Status, eplb.Report.MeanBalance)
	assert.LessOrEqual(t, res.Report.MeanBalance, eplb.Report.MeanBalance+1e-9)
}
