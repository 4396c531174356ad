package solver

import (
	"context"
	"time"

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
func CoverBottleneck(ctx context.Context, p Problem, backend Backend, plan *placement.Plan, l int, deadline time.Time) (int, int, error) {
	cl, ok := coverLayers(p)
	if !ok {
		return -1, -1, errNoDuals
	}
	part := planGroups(plan, l, p.Cluster.GPUs())
	z, err := cl[l].bottleneck(ctx, backend, part, deadline, uint64(l))
	return z, cl[l].maxGroupCover(part), err
}

// HomeAnneal exposes homeAnneal.
var HomeAnneal = homeAnneal

// HomeLowerBoundWith exposes homeLowerBoundWith.
var HomeLowerBoundWith = homeLowerBoundWith

// HomeCost exposes homeCost.
var HomeCost = homeCost

// HomeBottleneck exposes homeBottleneck.
var HomeBottleneck = homeBottleneck

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

// ResultMinD returns joint's certified per-layer busiest-GPU counts.
func ResultMinD(r *Result) []float64 { return r.minD }
