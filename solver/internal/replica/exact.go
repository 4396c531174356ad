package replica

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// exactPack searches one layer's plans exhaustively for a busiest load
// (tokens over speed, tokens split evenly over an expert's copies) below
// hi: every copy count vector whose copies fit under hi on the fastest
// GPU, each packed by branch and bound (copies largest first, onto GPUs
// with a free slot and no copy of the expert yet, GPUs in the same state
// tried once). GPU g has slots[g] slots; every expert gets at least one
// copy and at most one per GPU. It returns the best plan found (nil if
// none is below hi), its busiest load, and whether the search was
// complete, in which case no plan with these slots is below that load.
//
// It stops when m is done, and as soon as the count vectors left, at the
// nodes a vector has taken so far (at least one per slot; the first
// vector's nodes until it is done), would take longer than the time or
// work left at the rate measured so far: on layers with many experts it
// gives up within its first check.
func exactPack(load, speed []float64, slots []int, hi float64, m *task.Meter) (copies [][]placement.GPU, busiest float64, complete bool) {
	E, G := len(load), len(slots)
	S := 0
	for _, s := range slots {
		if s > E {
			return nil, hi, false // no plan: a GPU with more slots than experts
		}
		S += s
	}
	if E == 0 || G == 0 || S < E || S > E*G {
		return nil, hi, false
	}
	maxSp := slices.Max(speed)
	order := make([]int, E)
	for e := range order {
		order[e] = e
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(load[b], load[a]) })
	best := hi
	// fewest[i]: the fewest copies of order[i] whose share fits under best.
	fewest := make([]int, E)
	setFewest := func() bool {
		for i, e := range order {
			c := 1
			if best > 0 {
				c = max(1, int(math.Ceil(load[e]/(best*maxSp)*(1-1e-12))))
			}
			if c > G {
				return false
			}
			fewest[i] = c
		}
		return true
	}
	if !setFewest() {
		return nil, hi, true // one expert alone is above hi on any GPU
	}
	// countVectors is how many count vectors are left to pack (each
	// expert at least fewest copies, at most G, S in all).
	countVectors := func() float64 {
		next := make([]float64, S+1)
		next[0] = 1
		pre := make([]float64, S+2) // pre[s] = Σ next[:s]
		for i := E - 1; i >= 0; i-- {
			for s, v := range next {
				pre[s+1] = pre[s] + v
			}
			cur := make([]float64, S+1)
			for s := range cur {
				// Σ next[s−c] over c in [fewest, min(G, s)].
				if hi, lo := s-fewest[i], s-min(G, s); hi >= lo && hi >= 0 {
					cur[s] = pre[hi+1] - pre[lo]
				}
			}
			next = cur
		}
		return next[S]
	}
	vectors := countVectors()
	if vectors == 0 {
		return nil, hi, true
	}

	start := time.Now()
	var nodes, done int64
	var atStart int64 // nodes when the vector being packed began
	stopped := false
	// stop is checked every 1024 nodes: the meter, then the projection of
	// what is left at the rate so far.
	stop := func() bool {
		if stopped {
			return true
		}
		nodes++
		if nodes&1023 != 0 {
			return false
		}
		m.Spend(1024)
		if m.Done() {
			stopped = true
			return true
		}
		// Nodes left: the vectors left at the nodes a vector has taken so
		// far on average (at least one per slot); before the first vector
		// is done, at what it has taken already, so a first packing that
		// does not end (18 experts on 6 GPUs) is given up too.
		per := math.Max(float64(S), float64(nodes-atStart))
		if done > 0 {
			per = math.Max(float64(S), float64(nodes)/float64(done))
		}
		left := math.Max(vectors-float64(done), 0) * per
		if m.Work() {
			stopped = left > float64(m.Left())
		} else if el := time.Since(start); el > 0 {
			rate := float64(nodes) / el.Seconds()
			stopped = left/rate > m.Until().Seconds()
		}
		return stopped
	}

	cnt := make([]int, E) // by expert
	type item struct {
		e     int
		share float64
	}
	items := make([]item, 0, S)
	gl := make([]float64, G)
	gn := make([]int, G)
	on := make([][]bool, G) // on[g][e]
	for g := range on {
		on[g] = make([]bool, E)
	}
	at := make([]int, S) // GPU of items[k]
	var bestAt []int
	var bestItems []item
	type state struct {
		load, speed float64
		used, cap   int
	}
	seenAt := make([][]state, S) // per depth, the GPU states tried
	var place func(k int, peak float64) bool
	place = func(k int, peak float64) bool {
		if stop() {
			return false
		}
		if k == len(items) {
			best = peak
			bestAt = append(bestAt[:0], at...)
			bestItems = append(bestItems[:0], items...)
			return true
		}
		it := items[k]
		seen := seenAt[k][:0]
		found := false
		for g := range G {
			if gn[g] >= slots[g] || on[g][it.e] {
				continue
			}
			v := (gl[g] + it.share) / speed[g]
			if v >= best*(1-1e-12) {
				continue
			}
			st := state{gl[g], speed[g], gn[g], slots[g]}
			if slices.Contains(seen, st) {
				continue // interchangeable with a GPU already tried
			}
			seen = append(seen, st)
			seenAt[k] = seen
			gl[g] += it.share
			gn[g]++
			on[g][it.e] = true
			at[k] = g
			if place(k+1, max(peak, v)) {
				found = true
			}
			gl[g] -= it.share
			gn[g]--
			on[g][it.e] = false
			if stopped {
				break
			}
		}
		return found
	}
	pack := func() {
		items = items[:0]
		for e, c := range cnt {
			for range c {
				items = append(items, item{e, load[e] / float64(c)})
			}
		}
		slices.SortStableFunc(items, func(a, b item) int {
			if c := cmp.Compare(b.share, a.share); c != 0 {
				return c
			}
			return cmp.Compare(a.e, b.e)
		})
		if items[0].share/maxSp >= best*(1-1e-12) {
			return
		}
		if place(0, 0) {
			setFewest()
			// Fewer vectors fit under the new best: the projection counts
			// the new total against those packed so far.
			vectors = countVectors() + float64(done)
		}
	}
	var count func(i, left int)
	count = func(i, left int) {
		if stop() { // the enumeration's steps count as nodes too
			return
		}
		e := order[i]
		if i == E-1 {
			if left >= fewest[i] && left <= G {
				cnt[e] = left
				atStart = nodes
				pack()
				done++
			}
			return
		}
		// Most copies first for the heavy experts: their shares set the
		// busiest GPU.
		for c := min(G, left-(E-1-i)); c >= fewest[i]; c-- {
			cnt[e] = c
			count(i+1, left-c)
			if stopped {
				return
			}
		}
	}
	count(0, S)
	if bestAt == nil {
		return nil, hi, !stopped
	}
	copies = make([][]placement.GPU, E)
	for k, it := range bestItems {
		copies[it.e] = append(copies[it.e], placement.GPU(bestAt[k]))
	}
	for e := range copies {
		slices.Sort(copies[e])
	}
	return copies, best, !stopped
}
