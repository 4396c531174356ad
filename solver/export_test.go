package solver

import (
	"context"
	"time"

	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/placement"
)

// PairRefine exposes pairRefine to the external tests, which have HiGHS.
var PairRefine = pairRefine

// HomeLowerBound exposes homeLowerBound.
var HomeLowerBound = homeLowerBound

// PairFeasible exposes pairFeasible.
var PairFeasible = pairFeasible

// CoverBottleneck runs the bottleneck bound of one layer from plan's
// partition; it returns the certified z and the plan's busiest D_g.
func CoverBottleneck(ctx context.Context, p Problem, backend mip.Backend, plan *placement.Plan, l int, deadline time.Time) (int, int, error) {
	cl, ok := coverLayers(p)
	if !ok {
		return -1, -1, errNoDuals
	}
	part := planGroups(plan, l, p.Cluster.GPUs())
	z, _, err := cl[l].newCG(backend, uint64(l)).bottleneck(ctx, part, -1, deadline)
	return z, cl[l].maxGroupCover(part), err
}

// HomeAnneal runs homeAnneal with the problem's bitsets.
func HomeAnneal(ctx context.Context, p Problem, plan *placement.Plan, iters, restarts, threads int, deadline time.Time, seed uint64) (*placement.Plan, bool) {
	cls, _ := coverLayers(p)
	return homeAnneal(ctx, p, cls, plan, iters, restarts, threads, deadline, seed)
}

// HomeLowerBoundWith exposes homeLowerBoundWith.
var HomeLowerBoundWith = homeLowerBoundWith

// HomeCost exposes homeCost.
var HomeCost = homeCost

// CoverSearch runs the exhaustive group search of layer l: whether a group
// S with |S| ≤ E/G, N(S) ≤ z and π(S) ≥ theta exists (found), and every
// group the search returned.
func CoverSearch(p Problem, l int, pi []float64, z int, theta float64) (bool, [][]int) {
	cl, ok := coverLayers(p)
	if !ok {
		panic("coverLayers")
	}
	found, st := cl[l].coverSearchAll(context.Background(), pi, z, theta, 1<<30, time.Now().Add(time.Hour))
	if st == searchTimeout {
		panic("timeout")
	}
	return st == searchFound, found
}

// ResultCorners returns joint's certified per-layer corners as (L, D)
// pairs (see homeCorner).
func ResultCorners(r *Result) [][][2]float64 { return cornerPairs(r.corners) }

// HomeBottleneckPairs runs homeBottleneck and returns its corners as
// (L, D) pairs.
func HomeBottleneckPairs(ctx context.Context, p Problem, backend mip.Backend, plan *placement.Plan, deadline time.Time, workers int, seed uint64) ([][][2]float64, error) {
	cls, _ := coverLayers(p)
	c, err := homeBottleneck(ctx, p, cls, backend, plan, deadline, workers, seed)
	return cornerPairs(c), err
}

func cornerPairs(c [][]homeCorner) [][][2]float64 {
	out := make([][][2]float64, len(c))
	for l, cs := range c {
		for _, x := range cs {
			out[l] = append(out[l], [2]float64{x.L, x.D})
		}
	}
	return out
}

// SetCoverHeuristicStarts sets the heuristic pricing's starts per round
// and returns a function that restores the old value.
func SetCoverHeuristicStarts(n int) func() {
	old := coverHeuristicStarts
	coverHeuristicStarts = n
	return func() { coverHeuristicStarts = old }
}

// SwapColumns runs the support-column climb (coverswap.go) of layer l with
// routed tokens per group capped at lcap (0: none), returning at most
// limit groups.
func SwapColumns(p Problem, l int, pi []float64, z int, seeds [][]int, lcap, limit int) [][]int {
	cl, ok := coverLayers(p)
	if !ok {
		panic("coverLayers")
	}
	cl[l].lcap = lcap
	return cl[l].swapColumns(pi, z, seeds, limit)
}
