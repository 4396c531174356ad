package trafficbound

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/moetuner/moetuner/routing"
	"gonum.org/v1/gonum/mat"
)

// ChainCrossNode bounds from below, over every single-copy placement of
// layers layer−1 and layer on shape c (each expert exactly one copy, at
// most SlotsPerGPU[g] experts on GPU g, the two layers placed
// independently), the chain flow's cross-node transitions into layer
// (1 ≤ layer < Layers): Σ_t Count_t · Σ_{g1 used at layer−1}
// #{nodes B used at layer, B ≠ node(g1)}, the NIC copies costmodel counts
// for the transition. Sources play no part. See the package
// documentation for the certificate.
func ChainCrossNode(ctx context.Context, stats *routing.Stats, layer int, c Shape, opts Options) (Bound, error) {
	return chainCrossNode(ctx, stats, layer, c, opts, nil)
}

// pairMemo computes each layer's pair budgets once for all the layers
// that need them (layer l's node-level budget serves as PairBudget at l
// and PrevPairBudget at l+1); safe for concurrent use. A nil memo
// computes every time.
type pairMemo struct {
	mu sync.Mutex
	m  map[[2]int]*memoEntry
}

type memoEntry struct {
	once sync.Once
	v    float64
}

// get returns the budget of key (layer, 0 for nodes or 1 for GPUs),
// computing it with f (charging w) the first time.
func (pm *pairMemo) get(key [2]int, f func(w *Work) float64, w *Work) float64 {
	if pm == nil {
		return f(w)
	}
	pm.mu.Lock()
	e := pm.m[key]
	if e == nil {
		e = &memoEntry{}
		pm.m[key] = e
	}
	pm.mu.Unlock()
	e.once.Do(func() { e.v = f(w) })
	return e.v
}

func chainCrossNode(ctx context.Context, stats *routing.Stats, layer int, c Shape, opts Options, memo *pairMemo) (Bound, error) {
	if err := checkStats(stats, layer); err != nil {
		return Bound{}, err
	}
	if layer < 1 {
		return Bound{}, fmt.Errorf("trafficbound: chain-flow transitions start at layer 1 (layer 0 is dispatched from the homes); have layer %d", layer)
	}
	caps, err := c.check(stats)
	if err != nil {
		return Bound{}, err
	}
	if err := ctx.Err(); err != nil {
		return Bound{}, err
	}
	prev, err := tokenSet(stats, layer-1, c, false)
	if err != nil {
		return Bound{}, err
	}
	cur, err := tokenSet(stats, layer, c, false)
	if err != nil {
		return Bound{}, err
	}
	b := Bound{Tokens: cur.total}
	switch {
	case c.Nodes == 1:
		b.Method = MethodOneNode
		return b, nil
	case cur.total == 0:
		b.Method = MethodNoTokens
		return b, nil
	}
	b.Method = MethodMoments
	E, k := stats.Experts, stats.TopK
	T := make([]float64, E*E) // T[e1·E+e2]: weight of tokens with e1 at layer−1 and e2 at layer
	kw := map[[2]int]float64{}
	var s1, s2 []int
	for i := range stats.Patterns {
		pt := &stats.Patterns[i]
		if pt.Count == 0 {
			continue
		}
		s1 = distinct(s1[:0], pt.Experts[(layer-1)*k:layer*k])
		s2 = distinct(s2[:0], pt.Experts[layer*k:(layer+1)*k])
		kw[[2]int{len(s1), len(s2)}] += pt.Count
		for _, a := range s1 {
			for _, e := range s2 {
				T[a*E+e] += pt.Count
			}
		}
	}
	steps := opts.steps()
	b.PrevPairBudget = memo.get([2]int{layer - 1, 0}, func(w *Work) float64 {
		return pairBound(&pairProblem{C: prev.C, E: E, N: c.Nodes, caps: caps}, steps, w)
	}, &b.Work)
	b.PairBudget = memo.get([2]int{layer, 0}, func(w *Work) float64 {
		return pairBound(&pairProblem{C: cur.C, E: E, N: c.Nodes, caps: caps}, steps, w)
	}, &b.Work)
	// GPUs as the parts: pairs of a token's layer−1 experts on one GPU.
	b.PrevGPUPairBudget = pairBound(&pairProblem{C: prev.C, E: E, N: c.Nodes * c.GPUsPerNode, caps: c.SlotsPerGPU}, steps, &b.Work)
	b.CrossBudget = crossBound(T, E, c.Nodes, caps, &b.Work)
	keys := make([][2]int, 0, len(kw))
	for key := range kw {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, func(x, y [2]int) int {
		if x[0] != y[0] {
			return x[0] - y[0]
		}
		return x[1] - y[1]
	})
	groups := make([]group, 0, len(keys))
	for _, key := range keys {
		groups = append(groups, group{weight: kw[key], configs: chainConfigs(key[0], key[1], c.Nodes, c.GPUsPerNode)})
	}
	budget := []float64{b.PrevPairBudget, b.PairBudget, b.PrevGPUPairBudget, b.CrossBudget}
	nu, piv := multipliers(groups, budget)
	b.Work.Pivots += piv
	b.Multipliers = nu
	b.Value = settle(certify(groups, budget, nu), cur.total)
	return b, nil
}

func distinct(dst []int, ids []int16) []int {
	for _, e := range ids {
		if !slices.Contains(dst, int(e)) {
			dst = append(dst, int(e))
		}
	}
	return dst
}

// crossBound bounds from above Σ_B x_Bᵀ·T·y_B over two partitions X, Y
// of the E experts into nodes (column sums at most caps): the token
// weight of cross-layer pairs on a common node. With x_B = (m_B/E)·1 +
// r_B and y_B = (m'_B/E)·1 + s_B as in spectralBound,
//
//	Σ_B x_BᵀTy_B ≤ (Σ m²/E²)·1ᵀT1 + (‖PT1‖ + ‖PTᵀ1‖)·dev/E + Σ_{i<N} σ_i(PTP)·γ_i,
//
// dev = √(capmax·max Σ_B (m_B − m̄)²)
//
// (Cauchy–Schwarz for the first terms; von Neumann's trace inequality
// with Horn's product inequality, σ_i(SRᵀ) ≤ σ_i(S)σ_i(R) ≤ γ_i, for the
// last), the singular values from an SVD plus a rounding margin.
func crossBound(T []float64, E, N int, caps []int, w *Work) float64 {
	mt := newMassTerms(E, N, caps)
	fE := float64(E)
	row, col := make([]float64, E), make([]float64, E)
	tot := 0.0
	for a := range E {
		for b := range E {
			v := T[a*E+b]
			row[a] += v
			col[b] += v
			tot += v
		}
	}
	M := mat.NewDense(E, E, nil)
	fro := 0.0
	for a := range E {
		for b := range E {
			v := T[a*E+b] - row[a]/fE - col[b]/fE + tot/(fE*fE)
			M.Set(a, b, v)
			fro += v * v
		}
	}
	centered := func(x []float64) float64 {
		m := 0.0
		for _, v := range x {
			m += v / fE
		}
		s := 0.0
		for _, v := range x {
			s += (v - m) * (v - m)
		}
		return math.Sqrt(s)
	}
	// ‖S·(m−m̄)‖² ≤ Σ_B m'_B (m_B−m̄)² ≤ capmax·Σ_B (m_B−m̄)² for the other
	// layer's sizes m' (and likewise for R).
	dev := math.Sqrt(float64(slices.Max(caps)) * max(0, mt.sumSqMax-fE*fE/float64(N)))
	v := tot*mt.sumSqMax*mt.invE*mt.invE + (centered(row)+centered(col))*dev*mt.invE
	w.SVD++
	var svd mat.SVD
	margin := 1e-12 * fE * math.Sqrt(fro)
	if !svd.Factorize(M, mat.SVDNone) {
		for _, g := range mt.gamma {
			v += math.Sqrt(fro) * g // σ ≤ ‖M‖_F
		}
		return v
	}
	sv := svd.Values(nil)
	for i, g := range mt.gamma {
		v += (sv[i] + margin) * g
	}
	return v
}
