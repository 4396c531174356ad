package jointilp

import (
	"context"
	"math"
	"time"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// SolveOptions bound one solve of the joint ILP: by Budget (time), or
// when Nodes > 0 by that many branch-and-bound nodes in all (a work
// budget, shared evenly by the home flow's layers).
type SolveOptions struct {
	Budget time.Duration
	Nodes  int
	// Parallel home-flow layers at a time, each with a fair share of the
	// budget, at least MinLayer.
	Parallel int
	MinLayer time.Duration
	MIP      task.MIPSettings
}

// Solved is the joint ILP's answer: an assignment [l][e] → GPU, HiGHS's
// dual bound on the model objective (seconds; a layer stopped before HiGHS
// had a bound counts 0, its model time being non-negative) and the solves'
// sizes and statuses. A layer (or, in chain flow, the whole ILP) stopped
// by time before HiGHS had any incumbent keeps its warm start and counts
// as timed out.
type Solved struct {
	Assign   [][]int
	Bound    float64
	Tally    task.Tally
	TimedOut bool
}

// Solve solves the ILP from warm (canonical: see Canonical), one MIP per
// layer in the home flow (independent, in parallel), one for all layers in
// the chain flow.
func (jm *Model) Solve(ctx context.Context, backend mip.Backend, warm [][]int, opts SolveOptions) (*Solved, error) {
	res := &Solved{Assign: make([][]int, jm.L)}
	for l := range res.Assign {
		res.Assign[l] = make([]int, jm.E)
	}
	set := opts.MIP
	deadline := time.Now().Add(opts.Budget)
	if opts.Nodes > 0 {
		set.NodeLimit = opts.Nodes
		if !jm.chain {
			set.NodeLimit = max(1, opts.Nodes/jm.L)
		}
		deadline = time.Now().Add(24 * time.Hour) // only the nodes bound it
	}
	if jm.chain {
		b, lvs := jm.buildChain()
		layers := make([]int, jm.L)
		for l := range layers {
			layers[l] = l
		}
		ss := task.RunMIP(ctx, backend, b.Model(), jm.Start(b, warm, layers, lvs), set, opts.Budget)
		if ss.OutOfTime() {
			res.Assign, res.TimedOut = warm, true
			return res, nil
		}
		sol, err := res.Tally.Add(ss, "joint ILP")
		if err != nil {
			return nil, err
		}
		ReadAssign(sol.X, lvs, layers, res.Assign)
		res.Bound = sol.Bound / 1e6
		return res, nil
	}
	subs := make([]task.Sub, jm.L)
	lvsAll := make([]LayerVars, jm.L)
	task.Layers(jm.L, opts.Parallel, deadline, opts.MinLayer, func(l int, limit time.Duration) {
		b, lv := jm.buildHomeLayer(l)
		lvsAll[l] = lv
		subs[l] = task.RunMIP(ctx, backend, b.Model(), jm.Start(b, warm, []int{l}, []LayerVars{lv}), set, limit)
	})
	bound := 0.0
	for l, ss := range subs {
		if ss.OutOfTime() {
			copy(res.Assign[l], warm[l])
			res.TimedOut = true
			continue
		}
		sol, err := res.Tally.Add(ss, "joint ILP")
		if err != nil {
			return nil, err
		}
		ReadAssign(sol.X, []LayerVars{lvsAll[l]}, []int{l}, res.Assign)
		bound += math.Max(sol.Bound, 0)
	}
	res.Bound = bound / 1e6
	return res, nil
}

// MIPs builds the ILP(s) without solving them (for LP exports): one per
// layer in the home flow, one for all layers in the chain flow.
func (jm *Model) MIPs() []*mip.Model {
	if jm.chain {
		b, _ := jm.buildChain()
		return []*mip.Model{b.Model()}
	}
	var out []*mip.Model
	for l := range jm.L {
		b, _ := jm.buildHomeLayer(l)
		out = append(out, b.Model())
	}
	return out
}

// Chain reports whether the model is the chain flow's.
func (jm *Model) Chain() bool { return jm.chain }

// Layers and GPUs are the model's shape.
func (jm *Model) Layers() int { return jm.L }

// GPUs returns the model's GPU count.
func (jm *Model) GPUs() int { return jm.G }
