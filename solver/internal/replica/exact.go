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
	order := make([]int, E)
	for e := range order {
		order[e] = e
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(load[b], load[a]) })
	ps := &packSearch{
		load: load, speed: speed, slots: slots, m: m, E: E, G: G, S: S,
		maxSp: slices.Max(speed), order: order, best: hi, fewest: make([]int, E),
	}
	if !ps.setFewest() {
		return nil, hi, true // one expert alone is above hi on any GPU
	}
	ps.vectors = ps.countVectors()
	if ps.vectors == 0 {
		return nil, hi, true
	}
	ps.start = time.Now()
	ps.cnt = make([]int, E)
	ps.items = make([]packItem, 0, S)
	ps.gl = make([]float64, G)
	ps.gn = make([]int, G)
	ps.on = make([][]bool, G)
	for g := range ps.on {
		ps.on[g] = make([]bool, E)
	}
	ps.at = make([]int, S)
	ps.seenAt = make([][]packGPU, S)
	ps.count(0, S)
	if ps.bestAt == nil {
		return nil, hi, !ps.stopped
	}
	copies = make([][]placement.GPU, E)
	for k, it := range ps.bestItems {
		copies[it.e] = append(copies[it.e], placement.GPU(ps.bestAt[k]))
	}
	for e := range copies {
		slices.Sort(copies[e])
	}
	return copies, ps.best, !ps.stopped
}

// packSearch is exactPack's search: the count vectors it enumerates
// (count) and the branch and bound that packs each (place).
type packSearch struct {
	load, speed []float64
	slots       []int
	m           *task.Meter
	E, G, S     int
	maxSp       float64
	order       []int // experts, heaviest first
	best        float64
	// fewest[i]: the fewest copies of order[i] whose share fits under best.
	fewest  []int
	vectors float64 // count vectors to pack, the packed ones included

	start       time.Time
	nodes, done int64
	atStart     int64 // nodes when the vector being packed began
	stopped     bool
	cnt         []int // copies by expert
	items       []packItem
	gl          []float64
	gn          []int
	on          [][]bool // on[g][e]
	at          []int    // GPU of items[k]
	bestAt      []int
	bestItems   []packItem
	seenAt      [][]packGPU // per depth, the GPU states tried
}

// packItem is one copy to pack: its expert and its share of the load.
type packItem struct {
	e     int
	share float64
}

// packGPU is a GPU's state as the packing sees it: GPUs in the same state
// are interchangeable.
type packGPU struct {
	load, speed float64
	used, cap   int
}

// setFewest sets fewest from best; false when one expert alone is above
// best on any GPU.
func (ps *packSearch) setFewest() bool {
	for i, e := range ps.order {
		c := 1
		if ps.best > 0 {
			c = max(1, int(math.Ceil(ps.load[e]/(ps.best*ps.maxSp)*(1-1e-12))))
		}
		if c > ps.G {
			return false
		}
		ps.fewest[i] = c
	}
	return true
}

// countVectors is how many count vectors are left to pack (each expert at
// least fewest copies, at most G, S in all).
func (ps *packSearch) countVectors() float64 {
	E, G, S := ps.E, ps.G, ps.S
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
			if hi, lo := s-ps.fewest[i], s-min(G, s); hi >= lo && hi >= 0 {
				cur[s] = pre[hi+1] - pre[lo]
			}
		}
		next = cur
	}
	return next[S]
}

// stop is checked every 1024 nodes: the meter, then the projection of
// what is left at the rate so far.
func (ps *packSearch) stop() bool {
	if ps.stopped {
		return true
	}
	ps.nodes++
	if ps.nodes&1023 != 0 {
		return false
	}
	m := ps.m
	m.Spend(1024)
	if m.Done() {
		ps.stopped = true
		return true
	}
	// Nodes left: the vectors left at the nodes a vector has taken so
	// far on average (at least one per slot); before the first vector
	// is done, at what it has taken already, so a first packing that
	// does not end (18 experts on 6 GPUs) is given up too.
	per := math.Max(float64(ps.S), float64(ps.nodes-ps.atStart))
	if ps.done > 0 {
		per = math.Max(float64(ps.S), float64(ps.nodes)/float64(ps.done))
	}
	left := math.Max(ps.vectors-float64(ps.done), 0) * per
	if m.Work() {
		ps.stopped = left > float64(m.Left())
	} else if el := time.Since(ps.start); el > 0 {
		rate := float64(ps.nodes) / el.Seconds()
		ps.stopped = left/rate > m.Until().Seconds()
	}
	return ps.stopped
}

// place packs items[k:] with the busiest load so far peak, and reports
// whether it found a packing below best (which it then keeps).
func (ps *packSearch) place(k int, peak float64) bool {
	if ps.stop() {
		return false
	}
	if k == len(ps.items) {
		ps.best = peak
		ps.bestAt = append(ps.bestAt[:0], ps.at...)
		ps.bestItems = append(ps.bestItems[:0], ps.items...)
		return true
	}
	it := ps.items[k]
	seen := ps.seenAt[k][:0]
	found := false
	gl, gn, on, speed, slots := ps.gl, ps.gn, ps.on, ps.speed, ps.slots
	for g := range ps.G {
		if gn[g] >= slots[g] || on[g][it.e] {
			continue
		}
		v := (gl[g] + it.share) / speed[g]
		if v >= ps.best*(1-1e-12) {
			continue
		}
		st := packGPU{gl[g], speed[g], gn[g], slots[g]}
		if slices.Contains(seen, st) {
			continue // interchangeable with a GPU already tried
		}
		seen = append(seen, st)
		ps.seenAt[k] = seen
		gl[g] += it.share
		gn[g]++
		on[g][it.e] = true
		ps.at[k] = g
		if ps.place(k+1, max(peak, v)) {
			found = true
		}
		gl[g] -= it.share
		gn[g]--
		on[g][it.e] = false
		if ps.stopped {
			break
		}
	}
	return found
}

// pack packs the count vector cnt.
func (ps *packSearch) pack() {
	ps.items = ps.items[:0]
	for e, c := range ps.cnt {
		for range c {
			ps.items = append(ps.items, packItem{e, ps.load[e] / float64(c)})
		}
	}
	slices.SortStableFunc(ps.items, func(a, b packItem) int {
		if c := cmp.Compare(b.share, a.share); c != 0 {
			return c
		}
		return cmp.Compare(a.e, b.e)
	})
	if ps.items[0].share/ps.maxSp >= ps.best*(1-1e-12) {
		return
	}
	if ps.place(0, 0) {
		ps.setFewest()
		// Fewer vectors fit under the new best: the projection counts
		// the new total against those packed so far.
		ps.vectors = ps.countVectors() + float64(ps.done)
	}
}

// count enumerates the count vectors from order[i] on, left copies to
// give, and packs each.
func (ps *packSearch) count(i, left int) {
	if ps.stop() { // the enumeration's steps count as nodes too
		return
	}
	E, G := ps.E, ps.G
	e := ps.order[i]
	if i == E-1 {
		if left >= ps.fewest[i] && left <= G {
			ps.cnt[e] = left
			ps.atStart = ps.nodes
			ps.pack()
			ps.done++
		}
		return
	}
	// Most copies first for the heavy experts: their shares set the
	// busiest GPU.
	for c := min(G, left-(E-1-i)); c >= ps.fewest[i]; c-- {
		ps.cnt[e] = c
		ps.count(i+1, left-c)
		if ps.stopped {
			return
		}
	}
}
