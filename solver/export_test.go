package solver

import "github.com/moetuner/moetuner/solver/internal/onenode"

// ResultCorners returns joint's certified per-layer corners as (L, D)
// pairs: every plan of layer l has busiest routed tokens ≥ L and busiest
// distinct tokens ≥ D for one of them.
func ResultCorners(r *Result) [][][2]float64 {
	out := make([][][2]float64, len(r.corners))
	for l, cs := range r.corners {
		for _, x := range cs {
			out[l] = append(out[l], [2]float64{x.L, x.D})
		}
	}
	return out
}

// CountingBound is the one-node counting bound on the exact cost model,
// without certified corners.
func CountingBound(p Problem) (float64, bool) { return onenode.LowerBound(p.Scenario(), nil) }
