package solver

import (
	"fmt"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Evaluate scores plan on p exactly as Solve scores its plans: with p's
// defaults applied (a zero Model inferred from the statistics, count-only
// statistics given the model's top-k) and the cost model of p.Scenario,
// so that Evaluate(p, res.Plan) equals res.Report for a Result of Solve(p).
// It scores any plan that fits p's statistics and cluster, replicated or
// not, whatever strategy made it. A problem without statistics, a cluster
// that does not validate or a plan of another shape is an error.
func Evaluate(p Problem, plan *placement.Plan) (*costmodel.Report, error) {
	if plan == nil {
		return nil, fmt.Errorf("solver: Evaluate: no plan")
	}
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := p.Cluster.Validate(); err != nil {
		return nil, err
	}
	if g := p.Cluster.GPUs(); plan.GPUs != g {
		return nil, fmt.Errorf("solver: Evaluate: the plan is for %d GPUs but Problem.Cluster has %d", plan.GPUs, g)
	}
	return p.Scenario().Evaluate(plan)
}
