package replica

import (
	"math"

	"github.com/moetuner/moetuner/placement"
)

// OptimalShares returns per-slot shares of lp that minimise the busiest
// GPU's load/speed given load[e] per expert, and that busiest load. It
// bisects on the busiest load T, testing each T with a max flow from the
// experts (capacity load[e]) through their copies to the GPUs (capacity
// T·speed_g); the shares are the flows of the last feasible T.
func OptimalShares(load []float64, lp placement.LayerPlan, speed []float64) ([]float64, float64) {
	E, G := len(load), len(speed)
	total, sp := 0.0, 0.0
	for _, v := range load {
		total += v
	}
	for _, v := range speed {
		sp += v
	}
	shares := make([]float64, len(lp.SlotExpert))
	if total == 0 {
		copies := make([]int, E)
		for _, e := range lp.SlotExpert {
			copies[e]++
		}
		for s, e := range lp.SlotExpert {
			shares[s] = 1 / float64(copies[e])
		}
		return shares, 0
	}
	// Graph: 0 source, 1..E experts, E+1..E+G GPUs, E+G+1 sink.
	f := newFlow(E + G + 2)
	src, sink := 0, E+G+1
	for e, v := range load {
		f.edge(src, 1+e, v)
	}
	copyEdge := make([]int, len(lp.SlotExpert))
	for s, e := range lp.SlotExpert {
		copyEdge[s] = f.edge(1+int(e), 1+E+int(lp.SlotGPU[s]), load[e]) // a copy never carries more than its expert
	}
	sinkEdge := make([]int, G)
	for g := range G {
		sinkEdge[g] = f.edge(1+E+g, sink, 0)
	}
	feasible := func(T float64) bool {
		for g := range G {
			f.cap[sinkEdge[g]] = T * speed[g]
		}
		return f.maxflow(src, sink) >= total*(1-1e-12)
	}
	lo, hi := total/sp, 0.0
	{ // even split's busiest is feasible
		gl := make([]float64, G)
		copies := make([]int, E)
		for _, e := range lp.SlotExpert {
			copies[e]++
		}
		for s, e := range lp.SlotExpert {
			gl[lp.SlotGPU[s]] += load[e] / float64(copies[e])
		}
		for g, v := range gl {
			hi = math.Max(hi, v/speed[g])
		}
	}
	if feasible(lo) {
		hi = lo
	}
	for i := 0; i < 60 && hi-lo > 1e-12*hi; i++ {
		mid := (lo + hi) / 2
		if feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	feasible(hi)
	for s, e := range lp.SlotExpert {
		if load[e] > 0 {
			shares[s] = f.flowOn(copyEdge[s]) / load[e]
		}
	}
	// Experts without load: even shares; others renormalised (the flow
	// meets each expert's load up to rounding).
	sum := make([]float64, E)
	cnt := make([]int, E)
	for s, e := range lp.SlotExpert {
		sum[e] += shares[s]
		cnt[e]++
	}
	for s, e := range lp.SlotExpert {
		if load[e] == 0 || sum[e] == 0 {
			shares[s] = 1 / float64(cnt[e])
		} else {
			shares[s] /= sum[e]
		}
	}
	return shares, hi
}

// flow is a small Dinic max-flow on float capacities.
type flow struct {
	n          int
	head       []int
	next, to   []int
	cap, orig  []float64
	resid      []float64
	level, its []int
}

func newFlow(n int) *flow {
	f := &flow{n: n, head: make([]int, n), level: make([]int, n), its: make([]int, n)}
	for i := range f.head {
		f.head[i] = -1
	}
	return f
}

// edge adds u→v with capacity c and returns its index.
func (f *flow) edge(u, v int, c float64) int {
	add := func(a, b int, c float64) {
		f.to = append(f.to, b)
		f.cap = append(f.cap, c)
		f.next = append(f.next, f.head[a])
		f.head[a] = len(f.to) - 1
	}
	add(u, v, c)
	add(v, u, 0)
	return len(f.to) - 2
}

// flowOn is the flow on edge i after the last maxflow.
func (f *flow) flowOn(i int) float64 { return f.orig[i] - f.resid[i] }

func (f *flow) maxflow(s, t int) float64 {
	if f.orig == nil || len(f.orig) != len(f.cap) {
		f.orig = make([]float64, len(f.cap))
	}
	copy(f.orig, f.cap)
	f.resid = append(f.resid[:0], f.cap...)
	total := 0.0
	for f.bfs(s, t) {
		copy(f.its, f.head)
		for {
			pushed := f.dfs(s, t, math.Inf(1))
			if pushed <= 0 {
				break
			}
			total += pushed
		}
	}
	return total
}

func (f *flow) bfs(s, t int) bool {
	for i := range f.level {
		f.level[i] = -1
	}
	f.level[s] = 0
	q := []int{s}
	for len(q) > 0 {
		u := q[0]
		q = q[1:]
		for e := f.head[u]; e >= 0; e = f.next[e] {
			if f.resid[e] > 1e-12 && f.level[f.to[e]] < 0 {
				f.level[f.to[e]] = f.level[u] + 1
				q = append(q, f.to[e])
			}
		}
	}
	return f.level[t] >= 0
}

func (f *flow) dfs(u, t int, limit float64) float64 {
	if u == t {
		return limit
	}
	for ; f.its[u] >= 0; f.its[u] = f.next[f.its[u]] {
		e := f.its[u]
		v := f.to[e]
		if f.resid[e] > 1e-12 && f.level[v] == f.level[u]+1 {
			if d := f.dfs(v, t, math.Min(limit, f.resid[e])); d > 0 {
				f.resid[e] -= d
				f.resid[e^1] += d
				return d
			}
		}
	}
	return 0
}
