package solver

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Across says how a plan made for several workloads (Problem.Scenarios)
// combines them.
type Across int

const (
	// AcrossMean minimises the mean over workloads of the per-layer
	// busiest/mean GPU load.
	AcrossMean Across = iota
	// AcrossWorst minimises the worst workload's busiest/mean.
	AcrossWorst
)

// String returns "mean" or "worst".
func (a Across) String() string {
	if a == AcrossWorst {
		return "worst"
	}
	return "mean"
}

// ParseAcross maps "mean" or "worst" to an Across.
func ParseAcross(s string) (Across, error) {
	switch s {
	case "mean":
		return AcrossMean, nil
	case "worst":
		return AcrossWorst, nil
	}
	return 0, fmt.Errorf("solver: --across %q: want mean or worst", s)
}

// LayerBalance is the certified balance of one layer: the busiest GPU's
// load (tokens divided by speed), the mean, and a lower bound on the
// busiest load of any plan with the same slots.
type LayerBalance struct {
	Busiest, Mean, Bound float64
	// Under local dispatch: Traffic is the layer's token-expert pairs that
	// cross a NIC (per phase, sources uniform), Σ_e P_e·(N − nodes with
	// e)/N, and TrafficBound a lower bound on it for any plan whose
	// busiest GPU is at most Busiest (see trafficBound). 0 otherwise.
	Traffic, TrafficBound float64
}

// Gap is Busiest/Bound − 1.
func (b LayerBalance) Gap() float64 {
	if b.Bound <= 0 {
		return 0
	}
	return b.Busiest/b.Bound - 1
}

// BalanceReport certifies a replicated plan's load balance layer by layer.
type BalanceReport struct {
	Layers []LayerBalance
	// MaxGap and MeanGap summarise Layers' Gap.
	MaxGap, MeanGap float64
	// TrafficGap, under local dispatch with count-only statistics (where
	// Traffic is exactly what crosses the NICs), is Σ Traffic /
	// Σ TrafficBound − 1 over the layers: how far the cross-node traffic
	// is from the least any plan at most as unbalanced (layer by layer)
	// could have. 0 otherwise.
	TrafficGap float64
	// Scenario[s] is the mean over layers of busiest/mean for workload s
	// (Problem.Scenarios), nil without scenarios.
	Scenario []float64
}

// item weights: w[s][e] = load of expert e in scenario s, divided by its
// copy count when placed.
type packer struct {
	G      int
	slots  []int
	speed  []float64
	w      [][]float64 // [S][E] loads
	across Across
	norm   []float64 // per scenario: Σ load / Σ speed (the mean)
	// maxCopies caps an expert's copies (G: one per GPU; the number of
	// nodes when local dispatch spreads copies over nodes).
	maxCopies int
	// perNode > 0 (GPUs per node) keeps the copies of an expert on
	// distinct nodes, for local dispatch.
	perNode int
	// state
	cnt  []int       // copies per expert
	gpus [][]int     // experts on each GPU
	gl   [][]float64 // [S][G] load/speed
	has  []map[int]bool
	// nested marks a trial copy inside recountThenSwap (no deeper trials).
	nested bool
}

func newPacker(G int, slots []int, speed []float64, w [][]float64, across Across) *packer {
	pk := &packer{G: G, slots: slots, speed: speed, w: w, across: across, maxCopies: G}
	sumSpeed := 0.0
	for _, s := range speed {
		sumSpeed += s
	}
	pk.norm = make([]float64, len(w))
	for s, row := range w {
		t := 0.0
		for _, v := range row {
			t += v
		}
		pk.norm[s] = t / sumSpeed
		if pk.norm[s] <= 0 {
			pk.norm[s] = 1
		}
	}
	return pk
}

// apportion gives every expert in experts one copy and the remaining
// slots one at a time to the expert with the largest load per copy
// (Jefferson/D'Hondt), which minimises the largest replica load; copies are
// capped at maxCopies (distinct GPUs). weight is the per-expert load used.
func apportion(weight []float64, experts []int, slots, maxCopies int) ([]int, error) {
	cnt := make([]int, len(weight))
	if slots < len(experts) {
		return nil, fmt.Errorf("solver: %d slots for %d experts; every expert needs one", slots, len(experts))
	}
	if len(experts)*maxCopies < slots {
		return nil, fmt.Errorf("solver: %d slots exceed %d experts × %d GPUs (copies of one expert must sit on distinct GPUs)", slots, len(experts), maxCopies)
	}
	for _, e := range experts {
		cnt[e] = 1
	}
	for extra := slots - len(experts); extra > 0; extra-- {
		best := -1
		for _, e := range experts {
			if cnt[e] >= maxCopies {
				continue
			}
			if best < 0 || weight[e]*float64(cnt[best]) > weight[best]*float64(cnt[e]) {
				best = e
			}
		}
		cnt[best]++
	}
	return cnt, nil
}

// maxReplica is the largest load per copy.
func maxReplica(weight []float64, cnt []int) float64 {
	m := 0.0
	for e, c := range cnt {
		if c > 0 {
			m = math.Max(m, weight[e]/float64(c))
		}
	}
	return m
}

// init sets the copy counts and empties every GPU.
func (pk *packer) init(cnt []int) {
	pk.cnt = cnt
	pk.gpus = make([][]int, pk.G)
	pk.has = make([]map[int]bool, pk.G)
	pk.gl = make([][]float64, len(pk.w))
	for s := range pk.gl {
		pk.gl[s] = make([]float64, pk.G)
	}
	for g := range pk.has {
		pk.has[g] = map[int]bool{}
	}
}

// pack places cnt[e] copies of each expert on the GPUs in gpuSet.
func (pk *packer) pack(cnt []int, gpuSet []int) error {
	pk.init(cnt)
	err := pk.packItems(cnt, gpuSet)
	if err == nil {
		return nil
	}
	// Largest-first can paint itself into a corner (the last copies of a
	// many-copy expert find only GPUs that already hold it): place the
	// experts with the most copies first, each copy on the GPU with the
	// most free slots, which succeeds whenever any placement does when
	// slots are the only constraint; the swap search then rebalances.
	pk.init(cnt)
	if pk.packFeasible(cnt, gpuSet) == nil {
		return nil
	}
	pk.init(cnt)
	return err
}

// packFeasible places copies most-copies-first onto the GPUs with the most
// free slots (ties: least loaded).
func (pk *packer) packFeasible(cnt []int, gpuSet []int) error {
	var experts []int
	for e, c := range cnt {
		if c > 0 {
			experts = append(experts, e)
		}
	}
	agg := pk.aggWeight()
	sort.SliceStable(experts, func(i, j int) bool {
		a, b := experts[i], experts[j]
		if cnt[a] != cnt[b] {
			return cnt[a] > cnt[b]
		}
		return agg[a] > agg[b]
	})
	for _, e := range experts {
		for range cnt[e] {
			best, bestFree, bestLoad := -1, 0, 0.0
			for _, g := range gpuSet {
				free := pk.slots[g] - len(pk.gpus[g])
				if free <= 0 || pk.blocked(g, e, -1) {
					continue
				}
				v := 0.0
				for s := range pk.gl {
					v += pk.gl[s][g] / pk.norm[s]
				}
				if best < 0 || free > bestFree || (free == bestFree && v < bestLoad) {
					best, bestFree, bestLoad = g, free, v
				}
			}
			if best < 0 {
				return fmt.Errorf("solver: no GPU has a free slot for a copy of expert %d; give more slots or fewer copies", e)
			}
			pk.add(best, e)
		}
	}
	return nil
}

// aggWeight is the per-expert weight used for ordering: the mean over
// scenarios of normalised loads (the max for AcrossWorst).
func (pk *packer) aggWeight() []float64 {
	E := len(pk.w[0])
	agg := make([]float64, E)
	for s, row := range pk.w {
		for e, v := range row {
			if pk.across == AcrossWorst {
				agg[e] = math.Max(agg[e], v/pk.norm[s])
			} else {
				agg[e] += v / pk.norm[s] / float64(len(pk.w))
			}
		}
	}
	return agg
}

func (pk *packer) add(g, e int) {
	pk.gpus[g] = append(pk.gpus[g], e)
	pk.has[g][e] = true
	for s := range pk.gl {
		pk.gl[s][g] += pk.w[s][e] / float64(pk.cnt[e]) / pk.speed[g]
	}
}

// score is the objective (lower is better): per scenario busiest/mean,
// combined by mean or worst; tie is Σ squares of normalised loads, which
// breaks plateaus of the max.
func (pk *packer) score() (obj, tie float64) {
	for s, row := range pk.gl {
		m := 0.0
		for _, v := range row {
			m = math.Max(m, v)
			tie += (v / pk.norm[s]) * (v / pk.norm[s])
		}
		r := m / pk.norm[s]
		if pk.across == AcrossWorst {
			obj = math.Max(obj, r)
		} else {
			obj += r / float64(len(pk.gl))
		}
	}
	return obj, tie
}

// improve swaps copies between GPUs while a swap lowers the score (first
// by the objective, then by the tie-breaker), touching at most maxMoves
// slots (≤ 0: unlimited), until the deadline. A candidate swap changes two
// GPUs, so it is scored in O(S) from each scenario's three largest loads.
func (pk *packer) improve(gpuSet []int, deadline time.Time, maxMoves int) int {
	return pk.improveCost(gpuSet, deadline, maxMoves, 0)
}

// improveCost is improve where every swap must also pay moveCost (in units
// of the objective, busiest/mean) per slot it changes.
func (pk *packer) improveCost(gpuSet []int, deadline time.Time, maxMoves int, moveCost float64) int {
	moves := 0
	const eps = 1e-12
	S := len(pk.gl)
	type top3 struct {
		v [3]float64
		g [3]int
	}
	tops := make([]top3, S)
	inSet := make([]bool, pk.G)
	for _, g := range gpuSet {
		inSet[g] = true
	}
	for iter := 0; ; iter++ {
		if (iter%16 == 0 && time.Now().After(deadline)) || (maxMoves > 0 && moves+2 > maxMoves) {
			return moves
		}
		obj, tie := pk.score()
		crit := map[int]bool{}
		for s, row := range pk.gl {
			t := top3{v: [3]float64{-1, -1, -1}, g: [3]int{-1, -1, -1}}
			for g, v := range row {
				switch {
				case v > t.v[0]:
					t.v[2], t.g[2], t.v[1], t.g[1] = t.v[1], t.g[1], t.v[0], t.g[0]
					t.v[0], t.g[0] = v, g
				case v > t.v[1]:
					t.v[2], t.g[2] = t.v[1], t.g[1]
					t.v[1], t.g[1] = v, g
				case v > t.v[2]:
					t.v[2], t.g[2] = v, g
				}
			}
			tops[s] = t
			if inSet[t.g[0]] {
				crit[t.g[0]] = true
			}
		}
		// score of the state after moving weight between g1 and g2.
		eval := func(g1, g2, a, b int) (float64, float64) {
			o, tt := 0.0, tie
			for s := range S {
				wa := pk.w[s][a] / float64(pk.cnt[a])
				wb := pk.w[s][b] / float64(pk.cnt[b])
				n1 := pk.gl[s][g1] + (wb-wa)/pk.speed[g1]
				n2 := pk.gl[s][g2] + (wa-wb)/pk.speed[g2]
				m := math.Max(n1, n2)
				t := &tops[s]
				for k := range 3 {
					if t.g[k] != g1 && t.g[k] != g2 {
						m = math.Max(m, t.v[k])
						break
					}
				}
				r := m / pk.norm[s]
				if pk.across == AcrossWorst {
					o = math.Max(o, r)
				} else {
					o += r / float64(S)
				}
				q := pk.norm[s] * pk.norm[s]
				o1, o2 := pk.gl[s][g1], pk.gl[s][g2]
				tt += (n1*n1 + n2*n2 - o1*o1 - o2*o2) / q
			}
			return o, tt
		}
		bestObj, bestTie := obj, tie
		bg1, bi, bg2, bj := -1, -1, -1, -1
		critList := make([]int, 0, len(crit))
		for g := range crit {
			critList = append(critList, g)
		}
		sort.Ints(critList)
		for _, g1 := range critList {
			for i, a := range pk.gpus[g1] {
				for _, g2 := range gpuSet {
					if g2 == g1 || pk.blocked(g2, a, g1) {
						continue
					}
					for j, b := range pk.gpus[g2] {
						if a == b || pk.blocked(g1, b, g2) {
							continue
						}
						o, t := eval(g1, g2, a, b)
						if moveCost > 0 {
							// A paid move must lower the objective by its cost.
							if o+2*moveCost < bestObj-eps {
								bestObj, bestTie = o+2*moveCost, t
								bg1, bi, bg2, bj = g1, i, g2, j
							}
							continue
						}
						if o < bestObj-eps || (o <= bestObj+eps && t < bestTie-eps*math.Max(1, bestTie)) {
							bestObj, bestTie = o, t
							bg1, bi, bg2, bj = g1, i, g2, j
						}
					}
				}
			}
		}
		if bg1 < 0 {
			// No swap helps: try giving a slot of a busiest GPU to another
			// expert (one copy fewer of its expert, one more of another),
			// which changes replica sizes where swaps cannot.
			if maxMoves > 0 && moves+1 > maxMoves {
				return moves
			}
			if pk.recount(gpuSet, obj, tie, moveCost) {
				moves++
				continue
			}
			// A recount that only pays off after swaps: try the most
			// promising ones on copies, keep the best if it beats this.
			if maxMoves == 0 && moveCost == 0 && !pk.nested && obj > pk.lowerBound()*(1+1e-3) && pk.recountThenSwap(gpuSet, obj, deadline) {
				continue
			}
			return moves
		}
		pk.swap(bg1, bi, bg2, bj)
		moves += 2
	}
}

// recount moves one slot of a GPU in gpuSet from its expert a (with at
// least two copies) to an expert b without a copy there — one of the 16
// experts with the heaviest copies, the only ones a new copy can help — if
// that lowers the score by more than moveCost; it applies the best such
// move and reports whether it found one.
func (pk *packer) recount(gpuSet []int, obj, tie, moveCost float64) bool {
	const eps = 1e-12
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
func (pk *packer) recountThenSwap(gpuSet []int, obj float64, deadline time.Time) bool {
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
			if a == b || time.Now().After(deadline) {
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
			trial.improve(gpuSet, deadline, 0)
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

// replicaLayout is the per-problem slot layout for replicated plans.
type replicaLayout struct {
	slots []int // per GPU per layer
	total int
}

func (p Problem) layout() (replicaLayout, error) {
	G := p.Cluster.GPUs()
	E := p.Stats.Experts
	var lay replicaLayout
	if p.SlotsPerGPU != nil {
		if len(p.SlotsPerGPU) != G {
			return lay, fmt.Errorf("solver: SlotsPerGPU has %d entries for %d GPUs", len(p.SlotsPerGPU), G)
		}
		lay.slots = append([]int(nil), p.SlotsPerGPU...)
	} else {
		R := E + p.RedundantSlots
		if R%G != 0 {
			return lay, &InfeasibleError{Constraint: "slots", Detail: fmt.Sprintf("%d experts + %d redundant slots = %d slots per layer do not divide over %d GPUs; use %d or %d redundant slots", E, p.RedundantSlots, R, G, p.RedundantSlots-R%G, p.RedundantSlots+G-R%G)}
		}
		lay.slots = make([]int, G)
		for g := range lay.slots {
			lay.slots[g] = R / G
		}
	}
	for _, s := range lay.slots {
		lay.total += s
	}
	if lay.total < E {
		return lay, &InfeasibleError{Constraint: "slots", Detail: fmt.Sprintf("%d slots per layer cannot hold %d experts", lay.total, E)}
	}
	if eb := p.Model.ExpertBytes(); eb > 0 {
		for g, s := range lay.slots {
			have := p.Cluster.MemOf(g)
			need := int64(s) * eb * int64(p.Stats.Layers)
			if have > 0 && need > have {
				return lay, &InfeasibleError{Constraint: "memory", Detail: fmt.Sprintf("GPU %d needs %.2f GiB for %d expert slots × %d layers × %.1f MiB but has %.2f GiB: %.2f GiB missing; use fewer redundant slots, fewer slots on this GPU or more GPUs", g, gib(need), s, p.Stats.Layers, float64(eb)/(1<<20), gib(have), gib(need-have))}
			}
		}
	}
	return lay, nil
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// scenarioLoads returns per layer the [S][E] loads the packer balances.
func (p Problem) scenarioLoads(l int) [][]float64 {
	if len(p.Scenarios) == 0 {
		return [][]float64{p.Stats.Load[l]}
	}
	out := make([][]float64, len(p.Scenarios))
	for s, st := range p.Scenarios {
		out[s] = st.Load[l]
	}
	return out
}

// solveReplicated places every layer with replication: replica counts by
// apportionment (which minimises the largest replica), copies packed
// largest first, then improved by swaps; every layer's busiest load is
// certified against the bound max(mean, largest replica under the best
// apportionment). Layers run in parallel.
func solveReplicated(ctx context.Context, p Problem, backend mip.Backend, opts Options, start time.Time) (*Result, error) {
	lay, err := p.layout()
	if err != nil {
		return nil, err
	}
	s := p.Stats
	G, E, L := p.Cluster.GPUs(), s.Experts, s.Layers
	speed := make([]float64, G)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	groups := p.ExpertGroups
	if groups > 0 && (E%groups != 0 || groups%p.Cluster.Nodes != 0) {
		return nil, &InfeasibleError{Constraint: "expert groups", Detail: fmt.Sprintf("%d groups must divide %d experts and be a multiple of %d nodes", groups, E, p.Cluster.Nodes)}
	}
	deadline := start.Add(opts.TimeLimit)
	polishable := !opts.NoPolish && p.Current == nil && len(p.Scenarios) == 0 && (s.Patterns != nil || (p.Flow == costmodel.FlowChain && s.Transitions != nil))
	layersDone := deadline
	if polishable {
		layersDone = start.Add(opts.TimeLimit * 8 / 10)
	}
	copies := make([][][]placement.GPU, L)
	bal := make([]LayerBalance, L)
	errs := make([]error, L)
	parallelLayers(L, opts.Parallel, layersDone, func(l int, limit time.Duration) {
		if ctx.Err() != nil {
			errs[l] = ctx.Err()
			return
		}
		copies[l], bal[l], errs[l] = placeLayer(ctx, p, backend, l, lay, speed, groups, time.Now().Add(limit), opts.MaxMoves)
	})
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	plan := placement.FromReplicas(G, copies, string(StrategyJoint))
	// With per-token statistics the cost model sees which tokens share
	// GPUs and nodes: trade balance against communication by polishing on
	// the exact cost model (not for incremental re-placement, whose move
	// budget a polish would break).
	if polishable {
		_, before, err := Score(p, plan)
		if err != nil {
			return nil, err
		}
		polished, err := polish(ctx, p, plan, deadline, opts.Parallel)
		if err != nil {
			return nil, err
		}
		if _, after, err := Score(p, polished); err == nil && after < before {
			plan = polished
			for l := range L {
				copies[l] = plan.ExpertGPUs(l)
				bal[l] = layerBalance(p.Stats.Load[l], copies[l], speed, lay, G, p.localP())
			}
		}
	}
	res := &Result{Plan: plan, Status: StatusFeasible}
	br := &BalanceReport{Layers: bal}
	for _, b := range bal {
		br.MaxGap = math.Max(br.MaxGap, b.Gap())
		br.MeanGap += b.Gap() / float64(L)
	}
	if len(p.Scenarios) > 0 {
		br.Scenario = make([]float64, len(p.Scenarios))
		for si, st := range p.Scenarios {
			for l := range L {
				br.Scenario[si] += busiestOverMean(st.Load[l], copies[l], speed, p.localP()) / float64(L)
			}
		}
	}
	if br.MaxGap <= 1e-9 {
		res.Status = StatusOptimal
	}
	if time.Now().After(deadline) {
		res.Status = StatusTimeLimit
	}
	if p.Dispatch == placement.DispatchLocal && p.Stats.Patterns == nil {
		t, tb := 0.0, 0.0
		for _, b := range bal {
			t += b.Traffic
			tb += b.TrafficBound
		}
		if tb > 0 {
			br.TrafficGap = t/tb - 1
		}
	}
	res.Balance = br
	// For replicated plans the certified quantity is the busiest-GPU load:
	// Gap is the largest per-layer gap to its bound.
	res.Gap = br.MaxGap
	res.Bound, res.ModelObjective = math.NaN(), math.NaN()
	return res, nil
}

// busiestOverMean scores one layer of copies under a load vector (even
// split, or local dispatch with P GPUs per node when P > 0).
func busiestOverMean(load []float64, copies [][]placement.GPU, speed []float64, P int) float64 {
	gl := gpuLoads(load, copies, speed, P)
	total, sp := 0.0, 0.0
	for e := range copies {
		total += load[e]
	}
	for _, v := range speed {
		sp += v
	}
	m := 0.0
	for _, v := range gl {
		m = math.Max(m, v)
	}
	if total == 0 {
		return 1
	}
	return m / (total / sp)
}

// placeLayer places one layer (see solveReplicated).
func placeLayer(ctx context.Context, p Problem, backend mip.Backend, l int, lay replicaLayout, speed []float64, groups int, deadline time.Time, maxMoves int) ([][]placement.GPU, LayerBalance, error) {
	E, G := p.Stats.Experts, p.Cluster.GPUs()
	w := p.scenarioLoads(l)
	pk := newPacker(G, lay.slots, speed, w, p.Across)
	agg := pk.aggWeight()
	all := make([]int, G)
	for g := range all {
		all[g] = g
	}
	if p.Current != nil {
		if err := pk.load(p.Current, l, E); err != nil {
			return nil, LayerBalance{}, err
		}
		pk.improveCost(all, deadline, maxMoves, p.MoveCost)
	} else if groups > 0 {
		if err := pk.packGroups(p, agg, groups, all, deadline); err != nil {
			return nil, LayerBalance{}, err
		}
	} else {
		experts := make([]int, E)
		for e := range experts {
			experts[e] = e
		}
		cnt, err := apportion(agg, experts, lay.total, G)
		if err != nil {
			return nil, LayerBalance{}, err
		}
		// Local dispatch: at most one copy per node keeps every copy's
		// share exact and each node's tokens local, when the cap does not
		// raise the largest replica above the balance bound.
		if N := p.Cluster.Nodes; p.Dispatch == placement.DispatchLocal && N > 1 && N < G {
			if capped, err := apportion(agg, experts, lay.total, N); err == nil {
				mean := 0.0
				for _, v := range agg {
					mean += v / float64(G)
				}
				if maxReplica(agg, capped) <= math.Max(maxReplica(agg, cnt), mean)*(1+1e-9) {
					pk.maxCopies, pk.perNode = N, p.Cluster.GPUsPerNode
					if pk.pack(capped, all) == nil {
						cnt = nil // packed with copies on distinct nodes
					} else {
						pk.maxCopies, pk.perNode = G, 0
					}
				}
			}
		}
		if cnt != nil {
			if err := pk.pack(cnt, all); err != nil {
				return nil, LayerBalance{}, err
			}
		}
		pk.improve(all, deadline, 0)
		if pk.perNode > 0 && len(w) == 1 {
			pk = trafficFirst(pk, agg, lay, all, deadline)
		}
	}
	cp := pk.copies(E)
	if p.Dispatch == placement.DispatchLocal && groups == 0 && p.Current == nil {
		cp = spreadNodes(p, p.Stats.Load[l], cp, lay, speed, deadline.Add(time.Second))
	}
	b := layerBalance(p.Stats.Load[l], cp, speed, lay, G, p.localP())
	// One or two slots per GPU of equal speed: the exact pair method
	// proves a stronger bound and often packs to it.
	if backend != nil && groups == 0 && p.Current == nil && len(w) == 1 && p.Dispatch == placement.DispatchEven && b.Gap() > 1e-6 {
		if single, double, ok := pairLayout(lay, speed); ok {
			s0 := speed[0]
			load := make([]float64, E)
			for e, x := range p.Stats.Load[l] {
				load[e] = x / s0
			}
			bound, better, _ := pairRefine(ctx, backend, load, single, double, b.Bound, b.Busiest, deadline)
			if better != nil {
				if nb := layerBalance(p.Stats.Load[l], better, speed, lay, G, 0); nb.Busiest < b.Busiest {
					cp, b = better, nb
				}
			}
			b.Bound = math.Max(b.Bound, math.Min(bound, b.Busiest))
		}
	}
	return cp, b, nil
}

// trafficFirst tries, under local dispatch with copies on distinct nodes,
// the copy counts that cut cross-node traffic most among those that fit
// under pk's busiest load (trafficCounts), packed and improved the same
// way; it keeps them if the busiest load stays within max(pk's, 0.1 %
// above the bound) and the traffic drops, else returns pk.
func trafficFirst(pk *packer, agg []float64, lay replicaLayout, all []int, deadline time.Time) *packer {
	obj, _ := pk.score()
	maxSp := slices.Max(pk.speed)
	N := pk.G / pk.perNode
	cnt := trafficCounts(agg, lay.total, N, obj*pk.norm[0]*maxSp)
	if cnt == nil || slices.Equal(cnt, pk.cnt) {
		return pk
	}
	alt := newPacker(pk.G, pk.slots, pk.speed, pk.w, pk.across)
	alt.maxCopies, alt.perNode = N, pk.perNode
	if alt.pack(cnt, all) != nil {
		return pk
	}
	alt.improve(all, deadline, 0)
	altObj, _ := alt.score()
	if altObj > math.Max(obj, pk.lowerBound()*1.001)*(1+1e-12) {
		return pk
	}
	if countsTraffic(agg, alt.cnt, N) >= countsTraffic(agg, pk.cnt, N) {
		return pk
	}
	return alt
}

// layerBalance certifies one layer's busiest load under load: the bound is
// max(mean, largest replica under the apportionment that minimises it).
func layerBalance(load []float64, copies [][]placement.GPU, speed []float64, lay replicaLayout, G, P int) LayerBalance {
	total, sp, maxSp := 0.0, 0.0, 0.0
	for _, v := range load {
		total += v
	}
	for _, v := range speed {
		sp += v
		maxSp = math.Max(maxSp, v)
	}
	experts := make([]int, len(load))
	for e := range experts {
		experts[e] = e
	}
	mean := total / sp
	b := LayerBalance{Mean: mean, Busiest: busiestOverMean(load, copies, speed, P) * mean, Bound: mean}
	// apportion only fails for impossible slot counts, which layout()
	// has ruled out; the bound then stays at the mean.
	if cnt, err := apportion(load, experts, lay.total, G); err == nil {
		b.Bound = math.Max(mean, maxReplica(load, cnt)/maxSp)
	}
	if P > 0 {
		N := G / P
		b.Traffic = nodeTraffic(load, copies, P, N)
		if cnt := trafficCounts(load, lay.total, N, b.Busiest*maxSp); cnt != nil {
			b.TrafficBound = countsTraffic(load, cnt, N)
		}
	}
	return b
}

// trafficCounts returns the copy counts that minimise the cross-node
// traffic of local dispatch, Σ_e load_e·(N − min(n_e, N))/N, among those
// whose every copy fits under maxCopy (n_e ≥ ⌈load_e/maxCopy⌉), with
// Σ n_e = slots: the necessary minimum, then spare slots to the heaviest
// experts up to N copies each (each such copy saves load_e/N). Since any
// plan whose busiest GPU is at most maxCopy/max speed has copies no larger
// than maxCopy, their traffic bounds every such plan's from below. nil when
// the minimum exceeds slots.
func trafficCounts(load []float64, slots, N int, maxCopy float64) []int {
	E := len(load)
	cnt := make([]int, E)
	used := 0
	for e, x := range load {
		cnt[e] = 1
		if maxCopy > 0 {
			cnt[e] = max(1, int(math.Ceil(x/maxCopy-1e-9)))
		}
		used += cnt[e]
	}
	if used > slots {
		return nil
	}
	order := make([]int, E)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(i, j int) bool { return load[order[i]] > load[order[j]] })
	spare := slots - used
	for _, e := range order {
		for spare > 0 && cnt[e] < N {
			cnt[e]++
			spare--
		}
	}
	// Copies beyond N save nothing; put any left on the lightest experts.
	for i := len(order) - 1; spare > 0 && i >= 0; i-- {
		cnt[order[i]]++
		spare--
	}
	return cnt
}

// countsTraffic is the local-dispatch traffic of counts cnt with every
// expert's copies on distinct nodes.
func countsTraffic(load []float64, cnt []int, N int) float64 {
	t := 0.0
	for e, x := range load {
		t += x * float64(N-min(cnt[e], N)) / float64(N)
	}
	return t
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
func (pk *packer) packGroups(p Problem, agg []float64, groups int, all []int, deadline time.Time) error {
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
		pk.improve(all[nd*n:(nd+1)*n], deadline, 0)
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
