package replica

import (
	"fmt"
	"math"
	"sort"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// recount moves one slot of a GPU in gpuSet from its expert a (with at
// least two copies) to an expert b without a copy there — one of the 16
// experts with the heaviest copies, the only ones a new copy can help — if
// that lowers the score by more than the budget mb charges for its slot;
// it applies the best such move and reports whether it found one.
func (pk *packer) recount(gpuSet []int, obj, tie float64, mb *costmodel.MoveBudget) bool {
	const eps = 1e-12
	moveCost := mb.Charge(1)
	bestObj, bestTie := obj, tie
	bg, bi, bb := -1, -1, -1
	agg := pk.aggWeight()
	local := pk.present(gpuSet)
	var hot []int
	for e, c := range pk.cnt {
		if local[e] && c < pk.maxCopies {
			hot = append(hot, e)
		}
	}
	sort.SliceStable(hot, func(i, j int) bool {
		return agg[hot[i]]/float64(pk.cnt[hot[i]]) > agg[hot[j]]/float64(pk.cnt[hot[j]])
	})
	if len(hot) > 16 {
		hot = hot[:16]
	}
	for _, g := range gpuSet {
		for i, a := range pk.gpus[g] {
			if pk.cnt[a] < 2 {
				continue
			}
			for _, b := range hot {
				if b == a || pk.blocked(g, b, -1) {
					continue
				}
				pk.reassign(g, i, b)
				o, t := pk.score()
				pk.reassign(g, i, a)
				o += moveCost
				if o < bestObj-eps || (moveCost == 0 && o <= bestObj+eps && t < bestTie-eps*math.Max(1, bestTie)) {
					bestObj, bestTie, bg, bi, bb = o, t, g, i, b
				}
			}
		}
	}
	if bg < 0 {
		return false
	}
	pk.reassign(bg, bi, bb)
	return true
}

// lowerBound bounds the score from below: per workload, busiest/mean is at
// least max(1, largest replica under the best apportionment / mean),
// combined like the score.
func (pk *packer) lowerBound() float64 {
	slots := 0
	for _, n := range pk.slots {
		slots += n
	}
	maxSp := 0.0
	for _, v := range pk.speed {
		maxSp = math.Max(maxSp, v)
	}
	var experts []int
	for e, c := range pk.cnt {
		if c > 0 {
			experts = append(experts, e)
		}
	}
	lb := 0.0
	for s, w := range pk.w {
		r := 1.0
		if cnt, err := apportion(w, experts, slots, pk.G); err == nil {
			r = math.Max(1, maxReplica(w, cnt)/maxSp/pk.norm[s])
		}
		if pk.across == AcrossWorst {
			lb = math.Max(lb, r)
		} else {
			lb += r / float64(len(pk.w))
		}
	}
	return lb
}

// present marks the experts with a copy on a GPU in gpuSet.
func (pk *packer) present(gpuSet []int) []bool {
	out := make([]bool, len(pk.cnt))
	for _, g := range gpuSet {
		for _, e := range pk.gpus[g] {
			out[e] = true
		}
	}
	return out
}

// clone copies the packer's state for a trial.
func (pk *packer) clone() *packer {
	c := *pk
	c.cnt = append([]int(nil), pk.cnt...)
	c.gpus = make([][]int, pk.G)
	c.has = make([]map[int]bool, pk.G)
	for g := range pk.G {
		c.gpus[g] = append([]int(nil), pk.gpus[g]...)
		c.has[g] = make(map[int]bool, len(pk.has[g]))
		for e := range pk.has[g] {
			c.has[g][e] = true
		}
	}
	c.gl = make([][]float64, len(pk.gl))
	for s := range pk.gl {
		c.gl[s] = append([]float64(nil), pk.gl[s]...)
	}
	return &c
}

// recountThenSwap tries moving one copy from one of the 8 experts with the
// lightest copies (among those with two or more) to one of the 8 with the
// heaviest, each followed by a swap search, and keeps the best result if
// it beats obj.
func (pk *packer) recountThenSwap(gpuSet []int, obj float64, m *task.Meter) bool {
	agg := pk.aggWeight()
	per := func(e int) float64 { return agg[e] / float64(pk.cnt[e]) }
	local := pk.present(gpuSet)
	var donors, takers []int
	for e, c := range pk.cnt {
		if !local[e] {
			continue // with expert groups on nodes, gpuSet is one node
		}
		if c >= 2 {
			donors = append(donors, e)
		}
		if c < pk.maxCopies {
			takers = append(takers, e)
		}
	}
	sort.SliceStable(donors, func(i, j int) bool { return per(donors[i]) < per(donors[j]) })
	sort.SliceStable(takers, func(i, j int) bool { return per(takers[i]) > per(takers[j]) })
	donors, takers = donors[:min(8, len(donors))], takers[:min(8, len(takers))]
	inSet := make([]bool, pk.G)
	for _, g := range gpuSet {
		inSet[g] = true
	}
	var best *packer
	bestObj := obj - 1e-12
	for _, a := range donors {
		for _, b := range takers {
			if a == b || m.Done() {
				continue
			}
			// A copy of a on a GPU (in the set) without b.
			g, i := -1, -1
			for h := range pk.G {
				if !inSet[h] || !pk.has[h][a] || pk.blocked(h, b, -1) {
					continue
				}
				for k, e := range pk.gpus[h] {
					if e == a {
						g, i = h, k
					}
				}
				break
			}
			if g < 0 {
				continue
			}
			trial := pk.clone()
			trial.nested = true
			trial.reassign(g, i, b)
			m.Spend(1)
			trial.improve(gpuSet, m)
			if o, _ := trial.score(); o < bestObj {
				best, bestObj = trial, o
			}
		}
	}
	if best == nil {
		return false
	}
	best.nested = false
	*pk = *best
	return true
}

// blocked reports whether GPU g cannot take a copy of expert e: it holds
// one already, or (perNode > 0) another GPU of its node other than except
// does.
func (pk *packer) blocked(g, e, except int) bool {
	if pk.has[g][e] {
		return true
	}
	if pk.perNode == 0 {
		return false
	}
	b := g / pk.perNode
	for h := b * pk.perNode; h < (b+1)*pk.perNode; h++ {
		if h != g && h != except && pk.has[h][e] {
			return true
		}
	}
	return false
}

// reassign makes slot i of GPU g hold expert b instead of its expert a,
// updating copy counts and every affected GPU's load.
func (pk *packer) reassign(g, i, b int) {
	a := pk.gpus[g][i]
	ca, cb := float64(pk.cnt[a]), float64(pk.cnt[b])
	for h := range pk.G {
		ha, hb := pk.has[h][a], pk.has[h][b]
		for s := range pk.gl {
			if ha {
				d := -pk.w[s][a] / ca
				if h != g {
					d += pk.w[s][a] / (ca - 1)
				}
				pk.gl[s][h] += d / pk.speed[h]
			}
			if hb {
				pk.gl[s][h] += (pk.w[s][b]/(cb+1) - pk.w[s][b]/cb) / pk.speed[h]
			}
			if h == g {
				pk.gl[s][h] += pk.w[s][b] / (cb + 1) / pk.speed[h]
			}
		}
	}
	pk.cnt[a]--
	pk.cnt[b]++
	pk.gpus[g][i] = b
	delete(pk.has[g], a)
	pk.has[g][b] = true
}

// swap exchanges the i-th copy on g1 with the j-th copy on g2 (its own
// inverse).
func (pk *packer) swap(g1, i, g2, j int) {
	a, b := pk.gpus[g1][i], pk.gpus[g2][j]
	for s := range pk.gl {
		wa := pk.w[s][a] / float64(pk.cnt[a])
		wb := pk.w[s][b] / float64(pk.cnt[b])
		pk.gl[s][g1] += (wb - wa) / pk.speed[g1]
		pk.gl[s][g2] += (wa - wb) / pk.speed[g2]
	}
	pk.gpus[g1][i], pk.gpus[g2][j] = b, a
	delete(pk.has[g1], a)
	delete(pk.has[g2], b)
	pk.has[g1][b] = true
	pk.has[g2][a] = true
}

// copies returns [e] → sorted GPUs of its copies.
func (pk *packer) copies(E int) [][]placement.GPU {
	out := make([][]placement.GPU, E)
	for g, es := range pk.gpus {
		for _, e := range es {
			out[e] = append(out[e], placement.GPU(g))
		}
	}
	for e := range out {
		sort.Slice(out[e], func(i, j int) bool { return out[e][i] < out[e][j] })
	}
	return out
}

// load starts the packer from an existing plan's layer l.
func (pk *packer) load(plan *placement.Plan, l, E int) error {
	if l >= len(plan.Layers) || plan.GPUs != pk.G {
		return fmt.Errorf("solver: the current plan has %d layers on %d GPUs; the problem has layer %d on %d GPUs", len(plan.Layers), plan.GPUs, l, pk.G)
	}
	cnt := make([]int, E)
	lp := plan.Layers[l]
	for _, e := range lp.SlotExpert {
		cnt[e]++
	}
	pk.init(cnt)
	for i, e := range lp.SlotExpert {
		pk.add(int(lp.SlotGPU[i]), int(e))
	}
	return nil
}

// packGroups keeps each expert group (E/groups consecutive experts, as in
// DeepSeek's group-limited routing) on one node: groups go to nodes
// (groups/N each, heaviest first onto the lightest node, then improved by
// swaps), then every node replicates and packs its own experts.
func (pk *packer) packGroups(p Problem, l int, agg []float64, groups int, all []int, m *task.Meter) error {
	E, N, n := len(agg), p.Cluster.Nodes, p.Cluster.GPUsPerNode
	size := E / groups
	gload := make([]float64, groups)
	for e, v := range agg {
		gload[e/size] += v
	}
	order := make([]int, groups)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return gload[order[i]] > gload[order[j]] })
	nodeOf := make([]int, groups)
	nl := make([]float64, N)
	nc := make([]int, N)
	for _, gr := range order {
		best := -1
		for nd := range N {
			if nc[nd] < groups/N && (best < 0 || nl[nd] < nl[best]) {
				best = nd
			}
		}
		nodeOf[gr] = best
		nl[best] += gload[gr]
		nc[best]++
	}
	// Swap groups between nodes while the heaviest node gets lighter.
	for improved := true; improved; {
		improved = false
		for a := range groups {
			for b := a + 1; b < groups; b++ {
				na, nb := nodeOf[a], nodeOf[b]
				if na == nb {
					continue
				}
				old := math.Max(nl[na], nl[nb])
				d := gload[a] - gload[b]
				if math.Max(nl[na]-d, nl[nb]+d) < old-1e-12 {
					nl[na] -= d
					nl[nb] += d
					nodeOf[a], nodeOf[b] = nb, na
					improved = true
				}
			}
		}
	}
	// With per-token paths, which groups share a node decides the
	// cross-node traffic: trade it against the balance at the cost
	// model's prices.
	if t := newGroupTable(p, l, groups); t != nil && N > 1 {
		// The packer's loads are relative to the mean; the cost model
		// prices tokens.
		tok := make([]float64, groups)
		for e, v := range p.Stats.Load[l] {
			tok[e/size] += v
		}
		c := &groupCost{t: t, gload: tok, capacity: make([]float64, N), n: n,
			load: p.Stats.Load[l], size: size, slots: make([]int, N), fastest: make([]float64, N)}
		for g, sp := range pk.speed {
			c.capacity[g/n] += sp
			c.slots[g/n] += pk.slots[g]
			c.fastest[g/n] = math.Max(c.fastest[g/n], sp)
		}
		c.perTok, _ = p.Cluster.Coefficients(p.Model)
		c.copySec = p.Model.TokenBytes() / p.Cluster.NICBytesPerSec()
		pairs := int64(groups * (groups - 1) / 2)
		nodeOf = c.refine(nodeOf, func() bool {
			m.Spend(pairs)
			return m.Done()
		})
	}
	cnt := make([]int, E)
	for nd := range N {
		var experts []int
		for e := range E {
			if nodeOf[e/size] == nd {
				experts = append(experts, e)
			}
		}
		gpus := all[nd*n : (nd+1)*n]
		slots := 0
		for _, g := range gpus {
			slots += pk.slots[g]
		}
		c, err := apportion(agg, experts, slots, n)
		if err != nil {
			return fmt.Errorf("solver: node %d: %w", nd, err)
		}
		for _, e := range experts {
			cnt[e] = c[e]
		}
	}
	pk.init(cnt)
	for nd := range N {
		sub := make([]int, E)
		for e := range E {
			if nodeOf[e/size] == nd {
				sub[e] = cnt[e]
			}
		}
		if err := pk.packItems(sub, all[nd*n:(nd+1)*n]); err != nil {
			return err
		}
	}
	for nd := range N {
		pk.improve(all[nd*n:(nd+1)*n], m)
	}
	return nil
}

// packItems places sub[e] copies of each expert (pk.cnt holds every
// expert's total count) on gpus, largest replica first onto the least
// loaded GPU with a free slot that does not hold the expert yet.
func (pk *packer) packItems(sub []int, gpus []int) error {
	type item struct {
		e int
		v float64
	}
	agg := pk.aggWeight()
	var items []item
	for e, c := range sub {
		for range c {
			items = append(items, item{e, agg[e] / float64(pk.cnt[e])})
		}
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].v > items[j].v })
	for _, it := range items {
		best, bv := -1, 0.0
		for _, g := range gpus {
			if len(pk.gpus[g]) >= pk.slots[g] || pk.blocked(g, it.e, -1) {
				continue
			}
			v := 0.0
			for s := range pk.gl {
				v += pk.gl[s][g] / pk.norm[s]
			}
			if best < 0 || v < bv {
				best, bv = g, v
			}
		}
		if best < 0 {
			return fmt.Errorf("solver: no GPU has a free slot for a copy of expert %d; give more slots or fewer copies", it.e)
		}
		pk.add(best, it.e)
	}
	return nil
}
