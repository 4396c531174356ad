package replica

import (
	"fmt"
	"math"
	"sort"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/task"
)

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
// by the objective, then by the tie-breaker), with no move budget, until m
// is done (a deadline, or a work budget of scored swaps). A candidate swap
// changes two GPUs, so it is scored in O(S) from each scenario's three
// largest loads.
func (pk *packer) improve(gpuSet []int, m *task.Meter) int {
	return pk.improveCost(gpuSet, m, &costmodel.MoveBudget{})
}

// top3 is a scenario's three largest GPU loads and their GPUs.
type top3 struct {
	v [3]float64
	g [3]int
}

// topLoads sets tops[s] to scenario s's three largest GPU loads and
// returns the GPUs of inSet that are the busiest in some scenario.
func (pk *packer) topLoads(tops []top3, inSet []bool) map[int]bool {
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
	return crit
}

// improveCost is improve within the move budget mb (mb.SlotSec in units of
// the objective, busiest/mean): it touches at most b.Max slots, counting
// two for a swap and one for a recount (every slot it touches, which
// bounds the slots that differ from the running plan), and every move must
// also pay mb.Charge for the slots it touches. It returns the slots
// touched.
func (pk *packer) improveCost(gpuSet []int, m *task.Meter, mb *costmodel.MoveBudget) int {
	moves := 0
	const eps = 1e-12
	S := len(pk.gl)
	tops := make([]top3, S)
	inSet := make([]bool, pk.G)
	for _, g := range gpuSet {
		inSet[g] = true
	}
	for iter := 0; ; iter++ {
		if ((m.Work() || iter%16 == 0) && m.Done()) || !mb.Allows(moves+2) {
			return moves
		}
		obj, tie := pk.score()
		crit := pk.topLoads(tops, inSet)
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
						m.Spend(1)
						o, t := eval(g1, g2, a, b)
						if pay := mb.Charge(2); pay > 0 {
							// A paid move must lower the objective by its cost.
							if o+pay < bestObj-eps {
								bestObj, bestTie = o+pay, t
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
			if !mb.Allows(moves + 1) {
				return moves
			}
			if pk.recount(gpuSet, obj, tie, mb) {
				moves++
				continue
			}
			// A recount that only pays off after swaps: try the most
			// promising ones on copies, keep the best if it beats this.
			if mb.Left(moves) < 0 && mb.Charge(1) == 0 && !pk.nested && obj > pk.lowerBound()*(1+1e-3) && pk.recountThenSwap(gpuSet, obj, m) {
				continue
			}
			return moves
		}
		pk.swap(bg1, bi, bg2, bj)
		moves += 2
	}
}
