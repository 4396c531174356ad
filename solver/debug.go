package solver

import (
	"fmt"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/jointilp"
)

// JointMIPs builds the joint strategy's ILP(s) for p without solving them:
// one per layer in the home flow, one for all layers in the chain flow. It
// is meant for debugging (write them with mip.Model.WriteLP).
func JointMIPs(p Problem, opts Options) ([]*mip.Model, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	jm, err := jointilp.New(p.Scenario(), opts.MaxPairs)
	if err != nil {
		return nil, public(err)
	}
	return jm.MIPs(), nil
}

// jointModelObjective recomputes, in seconds, the joint ILP's model
// objective of a single-copy plan (the quantity Result.ModelObjective and
// Result.Bound refer to), with opts.MaxPairs as in the solve: what a plan
// the cap repair changed is worth in the ILP's model.
func jointModelObjective(p Problem, plan *placement.Plan, opts Options) (float64, error) {
	if err := p.check(); err != nil {
		return 0, err
	}
	jm, err := jointilp.New(p.Scenario(), opts.MaxPairs)
	if err != nil {
		return 0, public(err)
	}
	if len(plan.Layers) != jm.Layers() || plan.GPUs != jm.GPUs() {
		return 0, fmt.Errorf("solver: plan has %d layers on %d GPUs, problem %d on %d", len(plan.Layers), plan.GPUs, jm.Layers(), jm.GPUs())
	}
	assign := jointilp.PlanAssign(plan)
	for l, a := range assign {
		for e, g := range a {
			if g < 0 {
				return 0, fmt.Errorf("solver: layer %d: expert %d does not have exactly one copy", l, e)
			}
		}
	}
	return jm.Objective(assign) / 1e6, nil
}
