package trafficbound

import (
	"math/rand/v2"
	"slices"

	"github.com/moetuner/moetuner/routing"
)

// This file holds the entry points of the experiments harness
// (solver/internal/experiments), which asks where the home-flow bound
// loses against a plan, and the node-level search the benchmarks compare
// the bound with. HomeRemote does not call them.

// HomeLayer is one layer's home-flow configuration LP, open to budgets
// other than the ones HomeRemote certifies: what a perfect master would
// give.
type HomeLayer struct {
	lt     *layerTokens
	caps   []int
	groups []group
}

// NewHomeLayer reads the layer of stats (which must carry Patterns) on
// shape c for HomeLayer's methods; it returns HomeRemote's errors for bad
// input.
func NewHomeLayer(stats *routing.Stats, layer int, c Shape) (*HomeLayer, error) {
	if err := checkStats(stats, layer); err != nil {
		return nil, err
	}
	caps, err := c.check(stats)
	if err != nil {
		return nil, err
	}
	lt, err := tokenSet(stats, layer, c, false)
	if err != nil {
		return nil, err
	}
	h := &HomeLayer{lt: lt, caps: caps, groups: make([]group, 0, len(lt.kWeight))}
	for _, k := range sortedKeys(lt.kWeight) {
		h.groups = append(h.groups, group{weight: lt.kWeight[k], configs: homeConfigs(k, c.Nodes)})
	}
	return h, nil
}

// Tokens is Σ Count over the layer's patterns (Bound.Tokens).
func (h *HomeLayer) Tokens() float64 { return h.lt.total }

// ConfigLP returns the configuration LP's value, in token-weighted remote
// nodes (Bound.Value's unit), with home as the budget on the experts
// served on the source's node and pair as the budget on the pairs of a
// token's experts on a common node (Bound.HomeBudget, Bound.PairBudget):
// certified the way HomeRemote certifies its own budgets.
func (h *HomeLayer) ConfigLP(home, pair float64) float64 {
	budget := []float64{home, pair}
	nu, _ := multipliers(h.groups, budget)
	return certify(h.groups, budget, nu)
}

// ShiftedPairBound returns the spectral pair bound (DefaultShiftSteps) on
// the layer's co-activation matrix less 2·mu·load_a·load_b off the
// diagonal (load per expert, len Experts): the first term of the
// balance-aware pair budget at μ = mu, for a search over μ.
func (h *HomeLayer) ShiftedPairBound(mu float64, load []float64) float64 {
	E := h.lt.E
	C := make([]float64, E*E)
	for a := range E {
		for c := range E {
			if a != c {
				C[a*E+c] = h.lt.C[a*E+c] - 2*mu*load[a]*load[c]
			}
		}
	}
	var w Work
	return spectralBound(&pairProblem{C: C, E: E, N: h.lt.N, caps: h.caps}, DefaultShiftSteps, &w)
}

// NodeSearch is the comparison plan's search at layer l on N nodes of P
// GPUs: experts (one copy each) on nodes, from node (each expert's node;
// not modified), first-improvement swaps of two experts on different
// nodes in a fixed random order, keeping every node's routed load at most
// loadCap, for at most passes passes. Cost: Σ_t Count·(remote nodes
// used), sources −1 counting (N−1)/N per node used. It returns the nodes
// found.
func NodeSearch(st *routing.Stats, l, N, P int, node []int, loadCap float64, passes int) []int {
	E, k := st.Experts, st.TopK
	node = slices.Clone(node)
	type tok struct {
		w   float64
		src int // node, −1
	}
	toks := make([]tok, len(st.Patterns))
	cnt := make([][]uint8, len(st.Patterns))
	byExp := make([][]int32, E)
	nodeLoad := make([]float64, N)
	for i, pt := range st.Patterns {
		toks[i] = tok{pt.Count, -1}
		if pt.Source >= 0 {
			toks[i].src = int(pt.Source) / P
		}
		cnt[i] = make([]uint8, N)
		for _, e := range pt.Experts[l*k : (l+1)*k] {
			cnt[i][node[e]]++
			byExp[e] = append(byExp[e], int32(i))
		}
	}
	for e := range E {
		nodeLoad[node[e]] += st.Load[l][e]
	}
	weight := func(t int32, B int) float64 {
		switch s := toks[t].src; {
		case s < 0:
			return toks[t].w * float64(N-1) / float64(N)
		case s == B:
			return 0
		}
		return toks[t].w
	}
	move := func(e, to int) (delta float64) {
		from := node[e]
		for _, t := range byExp[e] {
			if cnt[t][from] == 1 {
				delta -= weight(t, from)
			}
			if cnt[t][to] == 0 {
				delta += weight(t, to)
			}
			cnt[t][from]--
			cnt[t][to]++
		}
		node[e] = to
		nodeLoad[from] -= st.Load[l][e]
		nodeLoad[to] += st.Load[l][e]
		return delta
	}
	r := rand.New(rand.NewPCG(uint64(l), 1))
	for range passes {
		improved := false
		for _, a := range r.Perm(E) {
			for _, b := range r.Perm(E) {
				X, Y := node[a], node[b]
				if X == Y {
					continue
				}
				la, lb := st.Load[l][a], st.Load[l][b]
				if nodeLoad[X]-la+lb > loadCap || nodeLoad[Y]+la-lb > loadCap {
					continue
				}
				d := move(a, Y) + move(b, X)
				if d < -1e-9 {
					improved = true
					continue
				}
				move(b, Y)
				move(a, X)
			}
		}
		if !improved {
			break
		}
	}
	return node
}
