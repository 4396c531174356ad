package jointilp

import (
	"github.com/moetuner/moetuner/placement"
)

// ReadAssign extracts assign[l][e] from a solution vector.
func ReadAssign(sol []float64, lvs []LayerVars, layers []int, assign [][]int) {
	for i, l := range layers {
		for e := range lvs[i].x {
			best, bv := 0, -1.0
			for g, j := range lvs[i].x[e] {
				if sol[j] > bv {
					best, bv = g, sol[j]
				}
			}
			assign[l][e] = best
		}
	}
}

// PlanAssign returns plan's assignment [l][e] → GPU (−1 for experts
// without exactly one copy).
func PlanAssign(plan *placement.Plan) [][]int {
	out := make([][]int, len(plan.Layers))
	for l := range plan.Layers {
		a := plan.Assignment(l)
		out[l] = make([]int, len(a))
		for e, g := range a {
			out[l][e] = int(g)
		}
	}
	return out
}

// AssignPlan builds a single-copy plan from assign[l][e] → GPU.
func AssignPlan(gpus int, assign [][]int, strategy string) *placement.Plan {
	a := make([][]placement.GPU, len(assign))
	for l := range assign {
		a[l] = make([]placement.GPU, len(assign[l]))
		for e, g := range assign[l] {
			a[l][e] = placement.GPU(g)
		}
	}
	return placement.FromAssignment(gpus, a, strategy)
}
