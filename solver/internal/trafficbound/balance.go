package trafficbound

import (
	"math"

	"gonum.org/v1/gonum/floats"

	"github.com/moetuner/moetuner/placement"
)

// balancedPairBudget bounds the pair term W (see pairBudget) over the
// plans whose every node serves at most capRatio times the mean node's
// token load, under even or static dispatch.
//
// With L_a expert a's token weight and x_a its copy shares over the nodes
// (row-stochastic), u = Σ_a L_a·x_a is the node loads of even dispatch,
// and for μ ≥ 0
//
//	Σ_{a<b} C_ab⟨x_a,x_b⟩ = Σ_{a<b} (C_ab − 2μ·L_a·L_b)⟨x_a,x_b⟩ + μ·(‖u‖² − Σ_a L_a²‖x_a‖²).
//
// The first sum is linear in each row (zero diagonal), so it is at most
// its maximum over partitions with the node capacities, as in pairBudget:
// the spectral bound on the shifted matrix (no star bound: it needs
// weights ≥ 0). For the second:
//   - ‖u‖² ≤ Q, the largest Σ_B v_B² with 0 ≤ v_B ≤ capRatio·mean and
//     Σ v = the total, when u is the node loads (even dispatch). Under
//     static dispatch the owners of a replicated expert serve their own
//     tokens, so the loads are u + Δ with Σ_B Δ_B = 0 and ‖Δ‖₁ ≤
//     2·Σ_a (1 − 1/c_a)·(a's owners' weight) (the homeBudget extra, X), so
//     ‖Δ‖ ≤ √2·X = δ, and ‖u‖² ≤ Q + 2·δ·√(Q − N·mean²) + δ²;
//   - ‖x_a‖² ≥ 1/min(c_a, N) for c_a copies, so Σ_a L_a²‖x_a‖² is at
//     least Σ_a L_a² less the most the redundant slots can take off it
//     (maxExtra).
//
// Static dispatch then adds pairBudget's owner term. μ is searched
// around μ0, half the least-squares fit of C on L·Lᵀ (the co-activation
// that popularity alone explains); any μ ≥ 0 gives a valid bound. It returns +Inf when the cap cannot hold (capRatio < 1).
// mut is noMutation except in the tests that weaken the bound.
func balancedPairBudget(lt *layerTokens, caps []int, R int, d placement.Dispatch, capRatio float64, steps int, mut balanceMutation, w *Work) float64 {
	E, N := lt.E, lt.N
	if !(capRatio >= 1) || d == placement.DispatchLocal || E < 2 || N < 2 {
		return math.Inf(1)
	}
	L := make([]float64, E)
	for a, row := range lt.nodeLoad {
		L[a] = floats.Sum(row)
	}
	T := floats.Sum(L)
	mean := T / float64(N)
	Q, left := 0.0, T // convex in v: fill nodes to the cap, largest first
	for range N {
		x := min(left, capRatio*mean)
		if mut == perfectBalance {
			x = mean
		}
		Q += x * x
		left -= x
	}
	U2, owner := Q, 0.0
	if d == placement.DispatchStaticMean && R > 0 {
		X := ownerExtra(lt, R)
		delta := math.Sqrt2 * X
		U2 = Q + 2*delta*math.Sqrt(max(0, Q-float64(N)*mean*mean)) + delta*delta
		owner = float64(lt.kmax-1) * X
	}
	D := floats.Dot(L, L)
	if R > 0 && mut != singleCopies {
		D -= maxExtra(E, R, min(N, R+1), func(e, c int) float64 {
			return L[e] * L[e] * (1 - 1/float64(c))
		})
	}
	num, den := 0.0, 0.0
	for a := range E {
		for b := range E {
			if a != b {
				p := L[a] * L[b]
				num += lt.C[a*E+b] * p
				den += p * p
			}
		}
	}
	if den == 0 {
		return math.Inf(1)
	}
	mu0 := max(0, num/den) / 2
	C := make([]float64, E*E)
	at := func(f float64) float64 {
		mu := f * mu0
		for a := range E {
			for b := range E {
				if a != b {
					C[a*E+b] = lt.C[a*E+b] - 2*mu*L[a]*L[b]
				}
			}
		}
		return spectralBound(&pairProblem{C: C, E: E, N: N, caps: caps}, steps, w) + mu*(U2-D)
	}
	// A golden-section search over μ/μ0 in [1/4, 3/2] (the bound is a
	// maximum of functions affine in μ: convex), six evaluations, each a
	// certified bound; the least is kept.
	best := goldenMin(at, 0.25, 1.5, 4)
	// Rounding: the sums above are in float64 over token weights.
	return best + owner + 1e-9*(math.Abs(best)+lt.total*float64(lt.kmax*lt.kmax))
}

// balanceMutation weakens balancedPairBudget for the tests, which must
// catch it (Options.mutation); production uses noMutation.
type balanceMutation int

const (
	noMutation     balanceMutation = iota
	singleCopies                   // copies do not spread an expert's load
	perfectBalance                 // the cap taken as 1
)
