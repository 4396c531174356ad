package replica

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/task"

	"github.com/moetuner/moetuner/placement"
)

// Exact replication for GPUs of equal speed holding one or two slots each
// (G1 GPUs with one slot, G2 with two; S = G1 + 2·G2 copies): the busiest
// GPU is then decided by the copy sizes alone. With copies sorted by size,
// the G1 largest go alone and the rest pair largest with smallest, which
// is optimal; so a threshold T is reachable (two copies of one expert on a
// GPU allowed, a relaxation) iff every copy is ≤ T and for every size
// u > T/2
//
//	#{copies ≥ u} − G1 ≤ #{copies ≤ T − u}
//
// (Hall's condition for a threshold graph: each large copy not alone needs
// its own partner ≤ T − u). Choosing the copy counts is a small ILP: z_i
// picks count c for expert e (item i = (e, c), size load_e/c), prefix sums
// Q_k = Σ_{i ≤ k} c_i·z_i over items sorted by size turn the condition
// into Q_k + Q_j ≤ S + G1, one row per distinct size. The counts may use
// fewer than S copies if small experts (copies ≤ T/2) have room for the
// rest: an extra copy of a small expert only shrinks its copies, so it
// never breaks the condition, and minimising the copies used steers HiGHS
// to a solution quickly. Raising T in steps while HiGHS proves
// infeasibility gives a valid lower bound for the layer; bisection above
// it finds counts that usually pack to their T.

// pairItem is one candidate copy count of an expert.
type pairItem struct {
	e, c int
	size float64
}

// pairItems are pairFeasible's candidate copy counts under threshold T
// (at most cmax copies an expert), largest copies first; false when a
// copy of some expert exceeds T at any count.
func pairItems(load []float64, T float64, cmax int) ([]pairItem, bool) {
	E := len(load)
	// uMax, the largest copy any counts can make, is each expert at its
	// fewest copies. A copy ≤ T − uMax partners every large copy, so more
	// copies of that expert are no better than spare slots it absorbs:
	// counts beyond that point are dominated and left out.
	lo := make([]int, E)
	uMax := 0.0
	for e, x := range load {
		lo[e] = 1
		if x > 0 {
			lo[e] = max(1, int(math.Ceil(x/T-1e-12)))
		}
		if lo[e] > cmax {
			return nil, false // a copy of e exceeds T
		}
		uMax = math.Max(uMax, x/float64(lo[e]))
	}
	var items []pairItem
	for e, x := range load {
		hi := cmax
		if room := T - uMax; room > 0 && x > 0 {
			hi = min(cmax, max(lo[e], int(math.Ceil(x/room-1e-12))))
		}
		for c := lo[e]; c <= hi; c++ {
			items = append(items, pairItem{e, c, x / float64(c)})
		}
	}
	sort.SliceStable(items, func(a, b int) bool {
		if items[a].size != items[b].size {
			return items[a].size > items[b].size
		}
		if items[a].e != items[b].e {
			return items[a].e < items[b].e
		}
		return items[a].c < items[b].c
	})
	return items, true
}

// pairFeasible reports whether threshold T is reachable and returns the
// copy counts when it is; proven is false when the backend stopped
// without a verdict.
func pairFeasible(ctx context.Context, backend mip.Backend, load []float64, G1, G2 int, T float64, deadline time.Time, nodes int) (cnt []int, feasible, proven bool, err error) {
	E, G, S := len(load), G1+G2, G1+2*G2
	if !(T > 0) {
		return nil, false, true, nil // every expert has some load or T is nonsense
	}
	cmax := min(G, S-E+1)
	items, ok := pairItems(load, T, cmax)
	if !ok {
		return nil, false, true, nil // a copy of some expert exceeds T
	}
	M := len(items)
	var bd mip.Builder
	z := make([]int, M)
	q := make([]int, M)
	for i, it := range items {
		// Minimising the copies used guides the search; spare slots go to
		// small experts afterwards, which never hurts (their copies only
		// shrink), so Σ ≤ S is exact.
		z[i] = bd.Col(fmt.Sprintf("z_%d_%d", it.e, it.c), 0, 1, float64(it.c), true)
	}
	for i := range items {
		q[i] = bd.Col(fmt.Sprintf("q_%d", i), 0, float64(S), 0, false)
	}
	perExpert := make([][]int, E)
	for i, it := range items {
		perExpert[it.e] = append(perExpert[it.e], z[i])
	}
	for e, cols := range perExpert {
		bd.Row(fmt.Sprintf("one_%d", e), 1, 1, cols, mip.Ones(len(cols)))
	}
	// Prefix sums.
	for i, it := range items {
		if i == 0 {
			bd.Row("q_0", 0, 0, []int{q[0], z[0]}, []float64{1, -float64(it.c)})
			continue
		}
		bd.Row(fmt.Sprintf("q_%d", i), 0, 0, []int{q[i], q[i-1], z[i]}, []float64{1, -1, -float64(it.c)})
	}
	bd.Row("total", math.Inf(-1), float64(S), []int{q[M-1]}, []float64{1})
	// The spare slots must fit on small experts (copies ≤ T/2, at most one
	// per GPU): Σ c·z + Σ_small (G − c)·z ≥ S. With it, Σ ≤ S is exact.
	absorbIdx := []int{q[M-1]}
	absorbVal := []float64{1}
	for i, it := range items {
		if it.size <= T/2 && it.c < G {
			absorbIdx = append(absorbIdx, z[i])
			absorbVal = append(absorbVal, float64(G-it.c))
		}
	}
	bd.Row("absorb", float64(S), math.Inf(1), absorbIdx, absorbVal)
	// Hall rows at the last item of every distinct size above T/2.
	for k := 0; k < M; k++ {
		u := items[k].size
		if u <= T/2 || (k+1 < M && items[k+1].size == u) {
			continue
		}
		// j = items with size > T − u.
		j := sort.Search(M, func(i int) bool { return items[i].size <= T-u })
		if j == 0 {
			bd.Row(fmt.Sprintf("hall_%d", k), math.Inf(-1), float64(S+G1), []int{q[k]}, []float64{1})
		} else {
			bd.Row(fmt.Sprintf("hall_%d", k), math.Inf(-1), float64(S+G1), []int{q[k], q[j-1]}, []float64{1, 1})
		}
	}
	limit := time.Until(deadline).Seconds()
	if limit <= 0.01 && nodes == 0 {
		return nil, false, false, nil
	}
	mo := mip.Options{TimeLimitSec: limit, RelGap: 1}
	if nodes > 0 {
		mo = mip.Options{NodeLimit: nodes, RelGap: 1} // a work budget: reproducible
	}
	// Any solution will do: stop at the first (gap 100 %).
	sol, err := backend.Solve(ctx, bd.Model(), mo)
	if err != nil {
		return nil, false, false, err
	}
	switch sol.Status {
	case mip.Infeasible:
		return nil, false, true, nil
	case mip.Optimal, mip.Feasible:
		if sol.X == nil {
			return nil, false, false, nil
		}
		cnt = make([]int, E)
		for i, it := range items {
			if sol.X[z[i]] > 0.5 {
				cnt[it.e] += it.c
			}
		}
		used := 0
		for _, c := range cnt {
			if c < 1 {
				return nil, false, false, nil
			}
			used += c
		}
		// Spare slots to the experts with the smallest copies that have
		// room (never a copy above T/2, so no new large copy; the absorb
		// row guarantees the room).
		for ; used < S; used++ {
			best := -1
			for e, c := range cnt {
				if c < G && load[e]/float64(c) <= T/2 && (best < 0 || load[e]/float64(c+1) < load[best]/float64(cnt[best]+1)) {
					best = e
				}
			}
			if best < 0 {
				return nil, false, false, nil
			}
			cnt[best]++
		}
		return cnt, true, true, nil
	}
	return nil, false, false, nil
}

// pairLayout reports the one- and two-slot GPUs of a layer when the exact
// pair method applies: every GPU of equal speed, with one or two slots.
func pairLayout(lay replicaLayout, speed []float64) (single, double []int, ok bool) {
	for g, s := range lay.slots {
		if speed[g] != speed[0] {
			return nil, nil, false
		}
		switch s {
		case 1:
			single = append(single, g)
		case 2:
			double = append(double, g)
		default:
			return nil, nil, false
		}
	}
	return single, double, true
}

// pairPack places copy counts cnt on the GPUs: the largest copies alone on
// the one-slot GPUs, the others paired largest with smallest, then pairs
// that hold two copies of one expert repaired by exchanging partners with
// another pair while both sums stay ≤ T. It returns nil if that fails.
func pairPack(load []float64, cnt []int, single, double []int, T float64) [][]placement.GPU {
	type cp struct {
		e    int
		size float64
	}
	var all []cp
	for e, c := range cnt {
		for range c {
			all = append(all, cp{e, load[e] / float64(c)})
		}
	}
	slices.SortStableFunc(all, func(a, b cp) int {
		if a.size != b.size {
			if a.size > b.size {
				return -1
			}
			return 1
		}
		return a.e - b.e
	})
	if len(all) != len(single)+2*len(double) {
		return nil
	}
	out := make([][]placement.GPU, len(load))
	for i, g := range single {
		if all[i].size > T*(1+1e-12) {
			return nil
		}
		out[all[i].e] = append(out[all[i].e], placement.GPU(g))
	}
	rest := all[len(single):]
	n := len(double)
	pairs := make([][2]cp, n)
	for i := range pairs {
		pairs[i] = [2]cp{rest[i], rest[len(rest)-1-i]}
	}
	sum := func(p [2]cp) float64 { return p[0].size + p[1].size }
	for i := range pairs {
		if pairs[i][0].e != pairs[i][1].e {
			continue
		}
		fixed := false
		for j := range pairs {
			if j == i {
				continue
			}
			a, b := [2]cp{pairs[i][0], pairs[j][1]}, [2]cp{pairs[j][0], pairs[i][1]}
			if a[0].e != a[1].e && b[0].e != b[1].e && sum(a) <= T*(1+1e-12) && sum(b) <= T*(1+1e-12) {
				pairs[i], pairs[j] = a, b
				fixed = true
				break
			}
		}
		if !fixed {
			return nil
		}
	}
	for i, p := range pairs {
		if sum(p) > T*(1+1e-12) {
			return nil
		}
		g := placement.GPU(double[i])
		out[p[0].e] = append(out[p[0].e], g)
		out[p[1].e] = append(out[p[1].e], g)
	}
	return out
}

// pairRefine bisects the threshold between lo (a valid bound) and the
// busiest load hi of the current copies, on loads divided by the common
// speed. It returns a better valid bound and, when it found counts that
// pack below hi, their copies (nil otherwise).
//
// Under a work budget (m.Work()) every probe is a HiGHS solve of at most
// opts.PairProbeNodes nodes and the clock plays no part.
func pairRefine(ctx context.Context, backend mip.Backend, load []float64, single, double []int, lo, hi float64, m *task.Meter, opts Options) (bound float64, copies [][]placement.GPU, busiest float64) {
	bound, busiest = lo, hi
	deadline, nodes := m.Deadline(), 0
	if m.Work() {
		deadline, nodes = time.Now().Add(m.Until()), opts.PairProbeNodes
	}
	probe := func(T float64) (cnt []int, feasible, proven bool) {
		// Each probe gets a share of the time left, so one hard probe
		// does not eat the whole budget.
		until := time.Now().Add(max(opts.PairProbeMin, time.Duration(opts.PairProbeShare*float64(time.Until(deadline)))))
		if until.After(deadline) {
			until = deadline
		}
		cnt, feasible, proven, err := pairFeasible(ctx, backend, load, len(single), len(double), T, until, nodes)
		if err != nil {
			return nil, false, false
		}
		return cnt, feasible, proven
	}
	done := func() bool { return ctx.Err() != nil || (!m.Work() && time.Now().After(deadline)) }
	// Raise the bound in growing steps: infeasibility just above a proven
	// bound is usually quick to prove, near the optimum it is not.
	low := lo
	half := time.Now().Add(time.Duration(opts.PairProofShare * float64(time.Until(deadline)))) // the rest is for plans
	for step := 1e-9; !done() && (m.Work() || time.Now().Before(half)) && low*(1+step) < hi; step = max(2*step, 2.5e-3) {
		T := low * (1 + step)
		cnt, feasible, proven := probe(T)
		if !proven {
			break
		}
		if feasible {
			hi = T
			if cp := pairPack(load, cnt, single, double, T); cp != nil {
				copies, busiest = cp, T
			}
			break
		}
		low, bound = T, T // proven: nothing reaches T
	}
	// Then bisect [low, hi] for better plans; a probe that runs out of
	// time raises low (to look above it) but not the bound.
	for it := 0; it < 40 && hi-low > 1e-4*hi && !done(); it++ {
		mid := (low + hi) / 2
		cnt, feasible, proven := probe(mid)
		if !feasible {
			low = mid
			if proven {
				bound = math.Max(bound, mid) // proven: nothing reaches mid
			}
			continue
		}
		hi = mid
		if cp := pairPack(load, cnt, single, double, mid); cp != nil {
			copies, busiest = cp, mid
		}
	}
	return bound, copies, busiest
}
