package replica

import (
	"math"
	"slices"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// gpuLoads returns one layer's token load per GPU divided by its speed:
// even split over copies, or under local dispatch (P > 0, GPUs per node)
// the split placement.LocalSplit gives when every GPU sources the same
// number of tokens.
func gpuLoads(load []float64, copies [][]placement.GPU, speed []float64, P int) []float64 {
	G := len(speed)
	gl := make([]float64, G)
	var gpus []int32
	var frac []float64
	for e, gs := range copies {
		if load[e] == 0 || len(gs) == 0 {
			continue
		}
		if P <= 0 || len(gs) == 1 {
			for _, g := range gs {
				gl[g] += load[e] / float64(len(gs))
			}
			continue
		}
		gpus = gpus[:0]
		for _, g := range gs {
			gpus = append(gpus, int32(g))
		}
		if cap(frac) < G*len(gs) {
			frac = make([]float64, G*len(gs))
		}
		frac = frac[:G*len(gs)]
		placement.LocalSplit(gpus, G, P, frac)
		n := len(gs)
		for h := 0; h < G; h++ {
			for i, g := range gs {
				gl[g] += load[e] * frac[h*n+i] / float64(G)
			}
		}
	}
	for g := range gl {
		gl[g] /= speed[g]
	}
	return gl
}

// localP returns the GPUs per node when p dispatches locally, else 0.
func (p Problem) localP() int {
	if p.Dispatch.Closed() == placement.DispatchLocal {
		return p.Cluster.GPUsPerNode
	}
	return 0
}

// nodeTraffic is the NIC-crossing load of one layer under local dispatch
// with uniform sources: Σ_e load_e·(N − nodes holding e)/N.
func nodeTraffic(load []float64, copies [][]placement.GPU, P, N int) float64 {
	t := 0.0
	var seen [64]bool
	for e, gs := range copies {
		k := 0
		clear(seen[:])
		for _, g := range gs {
			b := int(g) / P
			if b >= len(seen) || !seen[b] {
				if b < len(seen) {
					seen[b] = true
				}
				k++
			}
		}
		t += load[e] * float64(N-min(k, N)) / float64(N)
	}
	return t
}

// spreadNodes permutes whole GPUs of one layer (their slot contents)
// between nodes so that copies of an expert sit on different nodes, where
// local dispatch lets each node's tokens stay off the NICs. Only GPUs with
// the same speed, slot count and memory trade places, so every GPU keeps
// its load; a swap is kept only if it lowers the cross-node load without
// raising the busiest GPU. It returns the new copies.
func spreadNodes(p Problem, load []float64, copies [][]placement.GPU, lay replicaLayout, speed []float64, m *task.Meter) [][]placement.GPU {
	P, N := p.Cluster.GPUsPerNode, p.Cluster.Nodes
	G := len(speed)
	if N < 2 {
		return copies
	}
	// pos[c] is where GPU content c (the experts of original GPU c) now
	// sits; at[g] is the content at GPU g.
	pos := make([]int, G)
	at := make([]int, G)
	for g := range pos {
		pos[g], at[g] = g, g
	}
	content := make([][]int, G)
	for e, gs := range copies {
		for _, g := range gs {
			content[g] = append(content[g], e)
		}
	}
	cur := func() [][]placement.GPU { return movedCopies(copies, pos) }
	same := func(a, b int) bool {
		return speed[a] == speed[b] && lay.slots[a] == lay.slots[b] && p.Cluster.MemOf(a) == p.Cluster.MemOf(b)
	}
	busiest := func(c [][]placement.GPU) float64 {
		return slices.Max(gpuLoads(load, c, speed, P))
	}
	state := cur()
	traffic := nodeTraffic(load, state, P, N)
	peak := busiest(state)
	// cnt[e][b]: copies of expert e on node b.
	cnt := make([][]int, len(copies))
	for e, gs := range copies {
		cnt[e] = make([]int, N)
		for _, g := range gs {
			cnt[e][int(g)/P]++
		}
	}
	// delta is the change of nodeTraffic when content cu moves from node
	// a to b and content cv from b to a.
	delta := func(cu, cv, a, b int) float64 { return swapTraffic(load, copies, content, cnt, N, cu, cv, a, b) }
	apply := func(cu, cv, a, b int) { swapCounts(content, cnt, cu, cv, a, b) }
	// Phase 1: an expert with more copies than nodes is evenly split only
	// if every node holding it holds enough of its copies (a lone copy
	// would serve its whole node); move whole GPUs until the busiest GPU
	// is back at the even split's (permutation-invariant) peak, or no
	// move lowers (busiest, Σ load²).
	evenPeak := slices.Max(gpuLoads(load, copies, speed, 0))
	sq := func(c [][]placement.GPU) (float64, float64) {
		gl := gpuLoads(load, c, speed, P)
		s := 0.0
		for _, v := range gl {
			s += v * v
		}
		return slices.Max(gl), s
	}
	_, curSq := sq(state)
	for pass := 0; pass < 4*G && peak > evenPeak*(1+1e-9); pass++ {
		improved := false
		for u := 0; u < G; u++ {
			if m.Done() {
				return state
			}
			m.Spend(int64(G - u))
			for v := u + 1; v < G; v++ {
				if u/P == v/P || !same(u, v) {
					continue
				}
				cu, cv := at[u], at[v]
				pos[cu], pos[cv], at[u], at[v] = v, u, cv, cu
				next := cur()
				b, q := sq(next)
				if b < peak*(1-1e-12) || (b <= peak*(1+1e-12) && q < curSq*(1-1e-12)) {
					apply(cu, cv, u/P, v/P)
					state, peak, curSq = next, b, q
					traffic = nodeTraffic(load, state, P, N)
					improved = true
					continue
				}
				pos[cu], pos[cv], at[u], at[v] = u, v, cu, cv
			}
		}
		if !improved {
			break
		}
	}
	// Phase 2: lower the cross-node load without raising the busiest GPU.
	for pass := 0; pass < 4*G; pass++ {
		improved := false
		for u := 0; u < G; u++ {
			if m.Done() {
				return state
			}
			m.Spend(int64(G - u))
			for v := u + 1; v < G; v++ {
				if u/P == v/P || !same(u, v) {
					continue
				}
				cu, cv := at[u], at[v]
				d := delta(cu, cv, u/P, v/P)
				if d >= -1e-12*math.Max(traffic, 1) {
					continue
				}
				pos[cu], pos[cv], at[u], at[v] = v, u, cv, cu
				next := cur()
				if b := busiest(next); b <= peak*(1+1e-12) {
					apply(cu, cv, u/P, v/P)
					state, traffic, peak = next, traffic+d, math.Min(peak, b)
					improved = true
					continue
				}
				pos[cu], pos[cv], at[u], at[v] = u, v, cu, cv
			}
		}
		if !improved {
			break
		}
	}
	return state
}

// movedCopies is copies with every GPU g replaced by pos[g].
func movedCopies(copies [][]placement.GPU, pos []int) [][]placement.GPU {
	out := make([][]placement.GPU, len(copies))
	for e, gs := range copies {
		out[e] = make([]placement.GPU, len(gs))
		for i, g := range gs {
			out[e][i] = placement.GPU(pos[g])
		}
	}
	return out
}

// swapTraffic is the change of nodeTraffic when GPU content cu moves from
// node a to b and content cv from b to a (content[c] the experts of
// content c, cnt[e][b] the copies of expert e on node b, of N nodes).
func swapTraffic(load []float64, copies [][]placement.GPU, content, cnt [][]int, N, cu, cv, a, b int) float64 {
	d := 0.0
	move := func(e, from, to int) {
		if slices.Contains(content[cu], e) && slices.Contains(content[cv], e) {
			return // on both GPUs: its nodes do not change
		}
		before := 0
		if cnt[e][from] == 1 {
			before-- // leaves node from
		}
		if cnt[e][to] == 0 {
			before++ // reaches node to
		}
		d -= load[e] * float64(before) / float64(N)
	}
	for _, e := range content[cu] {
		if len(copies[e]) > 1 {
			move(e, a, b)
		}
	}
	for _, e := range content[cv] {
		if len(copies[e]) > 1 {
			move(e, b, a)
		}
	}
	return d
}

// swapCounts updates cnt for the swap swapTraffic prices.
func swapCounts(content, cnt [][]int, cu, cv, a, b int) {
	for _, e := range content[cu] {
		cnt[e][a]--
		cnt[e][b]++
	}
	for _, e := range content[cv] {
		cnt[e][b]--
		cnt[e][a]++
	}
}
