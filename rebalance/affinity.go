package rebalance

import (
	"context"
	"errors"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver"
)

// proposePaths is Propose from the current plan on the window's per-token
// paths (s.paths): the joint strategy's affinity search (solver.Solve with
// the paths, Problem.Current the running plan, Options.MaxMoves the
// budget) under Config.Dispatch, within what is left of Budget.Time; the
// solve's report of the running plan (solver.Result.CurrentReport) is
// the baseline, the running plan scored here only where the solve did
// not. A layer is reverted to the running plan where it changes more than
// MaxMoves slots (a safeguard) or, with a Horizon, where its modeled gain
// over Horizon steps does not pay for its migration; the proposal is then
// scored as a whole (SGLang's dealt tables couple the layers) and dropped
// for the running plan unless the cost model finds it faster.
func (r *Rebalancer) proposePaths(ctx context.Context, b Budget, s snapshot, t0 time.Time) (*Proposal, error) {
	c, m := r.cfg.Cluster, r.cfg.Model
	sc := costmodel.Scenario{Stats: s.paths, Cluster: c, Model: m, Dispatch: r.cfg.Dispatch}
	p := solver.Problem{Stats: s.paths, Cluster: c, Model: m, Dispatch: r.cfg.Dispatch,
		SlotsPerGPU: s.current.SlotsPerGPU(0), Current: s.current}
	perTok, _ := c.Coefficients(m)
	if b.Horizon > 0 {
		if perTok <= 0 {
			return nil, errors.New("rebalance: Budget.Horizon needs the cluster's compute speed (TFLOPS or TokenCost) to price a move against its gain")
		}
		p.MoveCost = moveCost(s.paths.Load, s.pathWeight, c, m, perTok, b.Horizon)
	}
	limit := b.Time
	if limit == 0 {
		limit = DefaultTime
	}
	opts := solveOptions(r.cfg.Solver, max(limit-time.Since(t0), time.Millisecond))
	opts.MaxMoves = b.MaxMoves
	// The running plan's step times (a deal of the whole plan under
	// SGLang's tables) do not wait for the solve.
	var curCost []float64
	var curErr error
	scored := make(chan struct{})
	go func() {
		defer close(scored)
		curCost, curErr = r.windowCost(s, s.current)
	}()
	res, err := solver.Solve(ctx, p, opts)
	<-scored
	if err != nil {
		return nil, err
	}
	if curErr != nil {
		return nil, curErr
	}
	curRep := res.CurrentReport
	if curRep == nil {
		if curRep, err = sc.Evaluate(s.current); err != nil {
			return nil, err
		}
	}
	next, err := Align(s.current, res.Plan)
	if err != nil {
		return nil, err
	}
	next.Strategy, next.Meta = "rebalance", nil
	prop := &Proposal{Steps: s.n, Status: res.Status, SolveTime: res.SolveTime, Paths: true,
		PathSteps: s.pathSteps, PathTokens: s.paths.Tokens,
		TimedOut: res.Status == solver.StatusTimeLimit || res.Status == solver.StatusStopped}
	mig, err := migrationPerLayer(s.current, next, c, m)
	if err != nil {
		return nil, err
	}
	// The layers' times in the solve's report (of its plan before Align)
	// decide the Horizon rule; a plan with layers put back is scored
	// afresh below.
	reverted := false
	for l := range next.Layers {
		moved := placement.ChangedSlots(s.current.Layers[l], next.Layers[l])
		gain := (curRep.Layers[l].TimeSec - res.Report.Layers[l].TimeSec) / s.pathWeight
		if moved > 0 && ((b.MaxMoves > 0 && moved > b.MaxMoves) || (b.Horizon > 0 && gain*float64(b.Horizon) <= mig[l])) {
			prop.Kept++
			next.Layers[l] = cloneLayer(s.current.Layers[l])
			mig[l], reverted = 0, true
		}
	}
	// Align only reorders slots within a GPU, which the cost model does
	// not see (SGLang numbers physical experts GPU by GPU, so an expert's
	// candidates keep their order): the solve's report stands for the
	// aligned plan unless a layer was put back.
	rep := res.Report
	if reverted || !placement.SameCopies(next, res.Plan) {
		if rep, err = sc.Evaluate(next); err != nil {
			return nil, err
		}
	}
	total := 0.0
	for _, v := range mig {
		total += v
	}
	gain := (curRep.TimeSec - rep.TimeSec) / s.pathWeight
	if !(rep.TimeSec < curRep.TimeSec*(1-1e-12)) || (b.Horizon > 0 && gain*float64(b.Horizon) <= total) {
		// Not faster as a whole (or not paying within the horizon): keep
		// the running plan.
		for l := range next.Layers {
			if placement.ChangedSlots(s.current.Layers[l], next.Layers[l]) > 0 {
				prop.Kept++
			}
		}
		next, rep = s.current.Clone(), curRep
		next.Strategy, next.Meta = "rebalance", nil
		clear(mig)
	}
	per := s.paths.Tokens * float64(len(next.Layers))
	prop.CurrentRemote, prop.Remote = curRep.RemoteCopies/per, rep.RemoteCopies/per
	prop.CurrentLayerSec, prop.LayerSec = curRep.TimeSec, rep.TimeSec
	newCost, err := r.windowCost(s, next)
	if err != nil {
		return nil, err
	}
	return prop, r.summarize(prop, s, next, mig, curCost, newCost)
}
