package costmodel

import "slices"

// patternIndex lists, for one layer, the patterns that use each expert:
// ids[start[e]:start[e+1]] for expert e, each pattern once.
type patternIndex struct {
	start []int32
	ids   []int32
}

// affected returns the patterns that use one of experts at layer l, each
// once.
func (ev *Evaluator) affected(l int, experts []int) []int32 {
	idx := ev.layerIndex(l)
	ev.gen++
	if ev.gen == 0 {
		clear(ev.stamp)
		ev.gen = 1
	}
	ev.pats = ev.pats[:0]
	for _, e := range experts {
		for _, i := range idx.ids[idx.start[e]:idx.start[e+1]] {
			if ev.stamp[i] != ev.gen {
				ev.stamp[i] = ev.gen
				ev.pats = append(ev.pats, i)
			}
		}
	}
	return ev.pats
}

// layerIndex is layer l's pattern index, built on first use.
func (ev *Evaluator) layerIndex(l int) *patternIndex {
	idx := &ev.index[l]
	if idx.start != nil {
		return idx
	}
	eng := ev.eng
	E, k := eng.e, eng.k
	idx.start = make([]int32, E+1)
	pats := eng.stats.Patterns
	for i := range pats {
		for j, e := range pats[i].Experts[l*k : (l+1)*k] {
			if !slices.Contains(pats[i].Experts[l*k:l*k+j], e) {
				idx.start[e+1]++
			}
		}
	}
	for e := 0; e < E; e++ {
		idx.start[e+1] += idx.start[e]
	}
	idx.ids = make([]int32, idx.start[E])
	fill := slices.Clone(idx.start[:E])
	for i := range pats {
		for j, e := range pats[i].Experts[l*k : (l+1)*k] {
			if !slices.Contains(pats[i].Experts[l*k:l*k+j], e) {
				idx.ids[fill[e]] = int32(i)
				fill[e]++
			}
		}
	}
	return idx
}
