package placement

import (
	"cmp"
	"maps"
	"slices"

	"github.com/moetuner/moetuner/routing"
)

// Layer returns the slot map of layer l. The returned LayerPlan shares its
// slices with p. Layer panics if l is out of range, as slice indexing does.
func (p *Plan) Layer(l int) LayerPlan {
	return p.Layers[l]
}

// Slots returns the number of physical slots of layer l (Experts for a plan
// without replication). It panics if l is out of range.
func (p *Plan) Slots(l int) int {
	return len(p.Layers[l].SlotExpert)
}

// ExpertGPUs returns, for every logical expert of layer l, the GPUs that
// hold a copy of it, sorted ascending. An expert with no copy gets an empty
// (nil) list. Slots whose expert id is outside [0, Experts) are skipped, and
// so are slots beyond the shorter of SlotExpert and SlotGPU; Validate reports
// both. It panics if l is out of range.
func (p *Plan) ExpertGPUs(l int) [][]GPU {
	lp := p.Layers[l]
	out := make([][]GPU, max(p.Experts, 0))
	n := min(len(lp.SlotExpert), len(lp.SlotGPU))
	for s := range n {
		e := int(lp.SlotExpert[s])
		if e < 0 || e >= len(out) {
			continue
		}
		out[e] = append(out[e], lp.SlotGPU[s])
	}
	for _, g := range out {
		slices.Sort(g)
	}
	return out
}

// Assignment returns, for every logical expert of layer l, the GPU of its
// only copy. Experts with no copy or with more than one copy (replicated)
// get -1, so the result is total for any plan; use ExpertGPUs for replicated
// plans. It panics if l is out of range.
func (p *Plan) Assignment(l int) []GPU {
	eg := p.ExpertGPUs(l)
	out := make([]GPU, len(eg))
	for e, gs := range eg {
		if len(gs) == 1 {
			out[e] = gs[0]
		} else {
			out[e] = -1
		}
	}
	return out
}

// SlotsPerGPU returns the number of slots of layer l on every GPU (len
// GPUs). Slots on GPUs outside [0, GPUs) are not counted. It panics if l is
// out of range.
func (p *Plan) SlotsPerGPU(l int) []int {
	lp := p.Layers[l]
	out := make([]int, max(p.GPUs, 0))
	for _, g := range lp.SlotGPU {
		if g >= 0 && int(g) < len(out) {
			out[g]++
		}
	}
	return out
}

// Clone returns a deep copy of p; nil for a nil p.
func (p *Plan) Clone() *Plan {
	if p == nil {
		return nil
	}
	q := *p
	q.Layers = make([]LayerPlan, len(p.Layers))
	for l, lp := range p.Layers {
		q.Layers[l] = LayerPlan{
			SlotExpert: slices.Clone(lp.SlotExpert),
			SlotGPU:    slices.Clone(lp.SlotGPU),
			SlotShare:  slices.Clone(lp.SlotShare),
		}
	}
	q.Meta = maps.Clone(p.Meta)
	q.StackEPLB = p.StackEPLB.clone()
	return &q
}

// Equal reports whether p and o describe the same plan slot by slot,
// including Strategy and Meta. Nil and empty slices or maps compare equal;
// two nil plans are equal, a nil and a non-nil plan are not. Plans that
// differ only in slot order are not Equal; compare GPUMajor() forms or
// ExpertGPUs to ignore the order.
func (p *Plan) Equal(o *Plan) bool {
	if p == nil || o == nil {
		return p == o
	}
	if p.GPUs != o.GPUs || p.Experts != o.Experts || p.Strategy != o.Strategy ||
		len(p.Layers) != len(o.Layers) || !maps.Equal(p.Meta, o.Meta) {
		return false
	}
	for l := range p.Layers {
		if !slices.Equal(p.Layers[l].SlotExpert, o.Layers[l].SlotExpert) ||
			!slices.Equal(p.Layers[l].SlotGPU, o.Layers[l].SlotGPU) ||
			!slices.Equal(p.Layers[l].SlotShare, o.Layers[l].SlotShare) {
			return false
		}
	}
	return true
}

// IsGPUMajor reports whether every layer lists its slots GPU by GPU: all
// slots of GPU 0, then all of GPU 1, and so on (SlotGPU non-decreasing).
func (p *Plan) IsGPUMajor() bool {
	for _, lp := range p.Layers {
		if !slices.IsSorted(lp.SlotGPU) {
			return false
		}
	}
	return true
}

// GPUMajor returns a copy of p whose slots are reordered GPU by GPU (a
// stable sort on SlotGPU, so slots of one GPU keep their relative order).
// The placement itself (which expert copies sit on which GPU) is unchanged.
// When every GPU holds the same number S of slots, slot s then lives on GPU
// s/S, the SGLang and EPLB convention. Layers whose SlotExpert and SlotGPU
// lengths differ are copied unchanged.
func (p *Plan) GPUMajor() *Plan {
	q := p.Clone()
	for l := range q.Layers {
		lp := &q.Layers[l]
		if len(lp.SlotExpert) != len(lp.SlotGPU) || slices.IsSorted(lp.SlotGPU) {
			continue
		}
		idx := make([]int, len(lp.SlotGPU))
		for i := range idx {
			idx[i] = i
		}
		src := p.Layers[l]
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(src.SlotGPU[a], src.SlotGPU[b]) })
		for i, s := range idx {
			lp.SlotExpert[i] = src.SlotExpert[s]
			lp.SlotGPU[i] = src.SlotGPU[s]
			if lp.SlotShare != nil {
				lp.SlotShare[i] = src.SlotShare[s]
			}
		}
		if q.StackEPLB != nil && l < len(q.StackEPLB.Log2Phy) {
			// The replica order stays; the slots it names are renumbered.
			to := make([]int32, len(idx))
			for i, s := range idx {
				to[s] = int32(i)
			}
			for _, row := range q.StackEPLB.Log2Phy[l] {
				for j, s := range row {
					if s >= 0 && int(s) < len(to) {
						row[j] = to[s]
					}
				}
			}
		}
	}
	return q
}

// FromAssignment builds a plan without replication from assign[l][e], the
// GPU of logical expert e at layer l. Experts is len(assign[0]) (0 without
// layers). Slots are laid out GPU-major: the slots of GPU 0 first, and
// within a GPU by ascending expert id, so that when all GPUs hold the same
// number of experts slot s lives on GPU s/(Experts/gpus), the SGLang
// convention (slot p on GPU p/(P/ep_size)). FromAssignment does not check
// its input; call Validate on the result.
func FromAssignment(gpus int, assign [][]GPU, strategy string) *Plan {
	copies := make([][][]GPU, len(assign))
	for l, row := range assign {
		copies[l] = make([][]GPU, len(row))
		for e, g := range row {
			copies[l][e] = []GPU{g}
		}
	}
	return FromReplicas(gpus, copies, strategy)
}

// FromReplicas builds a plan from copies[l][e], the GPUs holding a copy of
// logical expert e at layer l (one entry per copy). Experts is
// len(copies[0]) (0 without layers). Slots are laid out GPU-major, and
// within a GPU by ascending expert id, as in FromAssignment. FromReplicas
// does not check its input; call Validate on the result.
func FromReplicas(gpus int, copies [][][]GPU, strategy string) *Plan {
	p := &Plan{GPUs: gpus, Strategy: strategy, Layers: make([]LayerPlan, len(copies))}
	if len(copies) > 0 {
		p.Experts = len(copies[0])
	}
	type slot struct {
		g GPU
		e routing.Expert
	}
	for l, row := range copies {
		var ss []slot
		for e, gs := range row {
			for _, g := range gs {
				ss = append(ss, slot{g, routing.Expert(e)})
			}
		}
		slices.SortStableFunc(ss, func(a, b slot) int {
			if a.g != b.g {
				return cmp.Compare(a.g, b.g)
			}
			return cmp.Compare(a.e, b.e)
		})
		lp := LayerPlan{SlotExpert: make([]routing.Expert, len(ss)), SlotGPU: make([]GPU, len(ss))}
		for i, s := range ss {
			lp.SlotExpert[i], lp.SlotGPU[i] = s.e, s.g
		}
		p.Layers[l] = lp
	}
	return p
}

// sameEveryLayer repeats one layer's assignment for every layer.
func sameEveryLayer(layers int, row []GPU) [][]GPU {
	assign := make([][]GPU, layers)
	for l := range assign {
		assign[l] = slices.Clone(row)
	}
	return assign
}

// ChangedSlots returns how many slots of next hold an expert copy their
// GPU did not hold in prev: the expert weights a switch from prev to next
// must move onto a GPU. Copies that stay on their GPU count as unchanged
// wherever their slot is.
func ChangedSlots(prev, next LayerPlan) int {
	type copyAt struct {
		g GPU
		e routing.Expert
	}
	held := make(map[copyAt]int, len(prev.SlotExpert))
	for s, e := range prev.SlotExpert {
		held[copyAt{prev.SlotGPU[s], e}]++
	}
	changed := 0
	for s, e := range next.SlotExpert {
		k := copyAt{next.SlotGPU[s], e}
		if held[k] > 0 {
			held[k]--
		} else {
			changed++
		}
	}
	return changed
}

// SameCopies reports whether a and b have the same GPUs and layers and
// put every expert's copies on the same GPUs in every layer (slot order
// aside).
func SameCopies(a, b *Plan) bool {
	if a.GPUs != b.GPUs || len(a.Layers) != len(b.Layers) {
		return false
	}
	for l := range a.Layers {
		x, y := a.ExpertGPUs(l), b.ExpertGPUs(l)
		if len(x) != len(y) {
			return false
		}
		for e := range x {
			gx, gy := slices.Clone(x[e]), slices.Clone(y[e])
			slices.Sort(gx)
			slices.Sort(gy)
			if !slices.Equal(gx, gy) {
				return false
			}
		}
	}
	return true
}
