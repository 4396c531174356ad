package costmodel

import (
	"fmt"
	"slices"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
)

// A Splitter is a dispatch model bound to a plan: for every layer and
// expert, which share of each source GPU's tokens each of the expert's copy
// GPUs computes. It is the one dispatch interface of moetuner: Evaluate,
// the incremental Evaluator and every search that splits per source ask it
// (NewSplitter), so that a stack's rule is written once.
type Splitter interface {
	// Split fills frac (len G·len(gpus)) for expert e of layer l whose
	// slots sit on the distinct GPUs gpus (in any order), slots[i] of them on
	// gpus[i]: frac[h·len(gpus)+i] is the share of e's tokens sourced on
	// GPU h that gpus[i] computes; every source's shares add up to 1. It
	// reports whether the split is exact for a plan that has these copies
	// at (l, e) and is otherwise the bound plan: a model whose rule runs
	// through the whole plan (SGLang's deal) is exact for the bound plan's
	// copies and for moves that leave its random stream where it was, and
	// otherwise fills its closed form and returns false: rebind
	// (NewSplitter) to the changed plan for the exact split.
	Split(l, e int, gpus, slots []int32, frac []float64) (exact bool)
}

// NewSplitter binds dispatch d to plan for a cluster of G GPUs in nodes of
// gpusPerNode, the plan's layers sitting among the model's decoder layers
// as layout says (Scenario.Layout). Models that do not depend on the plan
// ignore plan and layout (plan may be nil); SGLang's tables (d.Dealt())
// deal the whole map SGLang loads for plan, the rows of dense decoder
// layers included (placement.SGLangRows: they draw from the same random
// stream before the MoE rows that follow them), which needs the same
// number of slots on every GPU (SGLang numbers physical experts GPU by
// GPU). With a layout that does not know the decoder layers the map is the
// plan's layers alone. A plan loaded from a file (every plan without
// Plan.StackEPLB) is dealt as SGLang's init_by_mapping builds the table; a
// plan with Plan.StackEPLB, the stack running EPLB itself, as init_by_eplb
// (its log2phy rows as candidates, one shared stream).
func NewSplitter(d placement.Dispatch, plan *placement.Plan, G, gpusPerNode int, layout placement.Layout) (Splitter, error) {
	switch d {
	case placement.DispatchEven, placement.DispatchVLLM, placement.DispatchTRTLLM:
		return evenSplit{}, nil
	case placement.DispatchLocal, placement.DispatchStaticMean:
		return closedSplit{d: d, G: G, P: gpusPerNode}, nil
	case placement.DispatchSGLangDynamic:
		return dynamicSplit{G: G, P: gpusPerNode}, nil
	}
	v, ok := sglangVariant(d)
	if !ok {
		return nil, fmt.Errorf("costmodel: unknown dispatch %v", d)
	}
	return newDealSplit(v, plan, G, gpusPerNode, layout)
}

// DealtPerRank reports whether SGLang's table for dispatch d deals plan on
// one random stream per rank (the node and GPU-only trees dealing a map
// loaded from a file, init_by_mapping: stackdispatch.SGLangStaticTable).
// There a copy moved into or out of a rank's deal shifts that rank's
// stream for every later deal, so a Splitter bound to one plan prices
// such moves on its closed form (Split returns false).
func DealtPerRank(d placement.Dispatch, plan *placement.Plan) bool {
	v, ok := sglangVariant(d)
	return ok && v != stackdispatch.SGLangStaticPlain && (plan == nil || plan.StackEPLB == nil)
}

// sglangVariant is the tree of SGLang's static table that d names.
func sglangVariant(d placement.Dispatch) (stackdispatch.SGLangVariant, bool) {
	switch d {
	case placement.DispatchSGLangStatic:
		return stackdispatch.SGLangStaticPlain, true
	case placement.DispatchSGLangStaticNode:
		return stackdispatch.SGLangStaticNode, true
	case placement.DispatchSGLangStaticNarrow:
		return stackdispatch.SGLangStaticNodeNarrow, true
	case placement.DispatchSGLangStaticGPUOnly:
		return stackdispatch.SGLangStaticGPUOnly, true
	}
	return 0, false
}

// evenSplit: every source splits evenly over the slots.
type evenSplit struct{}

func (evenSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	fillEven(gpus, slots, frac)
	return true
}

// fillEven gives every source the even split over the slots (a GPU with
// two slots of the expert takes two shares).
func fillEven(gpus, slots []int32, frac []float64) {
	n := len(gpus)
	tot := 0
	for _, s := range slots {
		tot += int(s)
	}
	for i := range frac {
		frac[i] = float64(slots[i%n]) / float64(tot)
	}
}

// closedSplit is a per-source closed form of placement (LocalSplit,
// StaticSplit), over distinct GPUs.
type closedSplit struct {
	d    placement.Dispatch
	G, P int
}

func (c closedSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	c.d.Split(gpus, c.G, c.P, frac)
	return true
}

// dynamicSplit is SGLang's dynamic dispatch in the newest tree, in
// expectation: a rank's nearest copy (stackdispatch.SGLangNearest with the
// narrowing rule) takes all its tokens; otherwise each token picks one of
// the expert's physical slots uniformly.
type dynamicSplit struct{ G, P int }

func (d dynamicSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	n := len(gpus)
	cands, S := physicalIDs(gpus, slots)
	for h := 0; h < d.G; h++ {
		row := frac[h*n : (h+1)*n]
		near := stackdispatch.SGLangNearest(cands, h, S, d.P, stackdispatch.SGLangStaticNodeNarrow)
		if near < 0 {
			fillEven(gpus, slots, row)
			continue
		}
		clear(row)
		row[slices.Index(gpus, near/int32(S))] = 1
	}
	return true
}

// physicalIDs numbers an expert's slots as SGLang would if every GPU held
// S = max(slots) slots: slot j of gpus[i] is gpus[i]·S + j, sorted. Which
// physical id a copy has within its GPU never changes which GPU computes a
// token, so any S at least the largest count gives the same loads.
func physicalIDs(gpus, slots []int32) ([]int32, int) {
	S := int32(1)
	for _, s := range slots {
		S = max(S, s)
	}
	ids := make([]int32, 0, len(gpus))
	for i, g := range gpus {
		for j := int32(0); j < slots[i]; j++ {
			ids = append(ids, g*S+j)
		}
	}
	slices.Sort(ids)
	return ids, int(S)
}

// dealSplit is SGLang's static table (stackdispatch.SGLangStaticTable) of
// a bound plan, kept per (layer, expert) as what moves can reuse: the
// number of candidates n, the ranks dealt (in rank order) and the position
// each was dealt. A deal's positions depend only on the (n, dealt ranks)
// of the deals before it on the same stream, so another placement of one
// expert's copies with the same n and the same dealt ranks (the same
// number of them where one stream serves every rank) is dealt the same
// positions.
type dealSplit struct {
	v       stackdispatch.SGLangVariant
	G, P, E int
	perRank bool
	n       []int32   // [l·E+e]
	dealt   [][]int32 // [l·E+e]: ranks dealt, ascending
	pos     [][]int32 // [l·E+e]: the position dealt to each of dealt
}

func newDealSplit(v stackdispatch.SGLangVariant, plan *placement.Plan, G, P int, layout placement.Layout) (Splitter, error) {
	if plan == nil {
		return nil, fmt.Errorf("costmodel: %s dispatch needs the plan it deals for", v)
	}
	for l := range plan.Layers {
		for g, c := range plan.SlotsPerGPU(l) {
			if c0 := plan.SlotsPerGPU(0)[0]; c != c0 {
				return nil, fmt.Errorf("costmodel: %s dispatch: layer %d: GPU %d holds %d slots, GPU 0 holds %d; SGLang numbers physical experts GPU by GPU and needs the same count on every GPU", v, l, g, c, c0)
			}
		}
	}
	if layout.ModelLayers > 0 && len(layout.LayerIDs) == 0 && layout.ModelLayers != len(plan.Layers) {
		layout.ModelLayers = 0 // where the MoE layers sit is unknown
	}
	rows, moeRows, err := placement.SGLangRows(plan, layout)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", v, err)
	}
	if plan.StackEPLB != nil {
		return newEPLBDealSplit(v, plan, G, P, rows, moeRows)
	}
	E, L := plan.Experts, len(plan.Layers)
	S := len(rows[0]) / G
	phy := make([][]int32, len(rows))
	for r, row := range rows {
		phy[r] = make([]int32, len(row))
		for i, e := range row {
			phy[r][i] = int32(e)
		}
	}
	cands, err := stackdispatch.CandidatesFromPhy2Log(phy, E)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", v, err)
	}
	table, err := stackdispatch.SGLangStaticTable(cands, G, max(S, 1), P, v, stackdispatch.SGLangInitByMapping)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch: %w", v, err)
	}
	d := &dealSplit{v: v, G: G, P: P, E: E, perRank: v != stackdispatch.SGLangStaticPlain,
		n: make([]int32, L*E), dealt: make([][]int32, L*E), pos: make([][]int32, L*E)}
	for l := range L {
		row := moeRows[l]
		for e := range E {
			c := cands[row][e]
			i := l*E + e
			d.n[i] = int32(len(c))
			d.dealt[i] = stackdispatch.SGLangDealtRanks(c, G, S, P, v, nil)
			d.pos[i] = make([]int32, len(d.dealt[i]))
			for j, r := range d.dealt[i] {
				d.pos[i][j] = int32(slices.Index(c, table[r][row][e]))
			}
		}
	}
	return d, nil
}

func (d *dealSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	n := len(gpus)
	cands, S := physicalIDs(gpus, slots)
	clear(frac[:d.G*n])
	i := l*d.E + e
	var dealt []int32
	exact := i < len(d.n) && int(d.n[i]) == len(cands)
	j := 0
	for h := 0; h < d.G; h++ {
		near := stackdispatch.SGLangNearest(cands, h, S, d.P, d.v)
		if near >= 0 {
			frac[h*n+slices.Index(gpus, near/int32(S))] = 1
			continue
		}
		dealt = append(dealt, int32(h))
		if exact && j < len(d.dealt[i]) && (!d.perRank || d.dealt[i][j] == int32(h)) {
			p := cands[d.pos[i][j]]
			frac[h*n+slices.Index(gpus, p/int32(S))] = 1
			j++
			continue
		}
		exact = false
	}
	if exact && j == len(d.dealt[i]) {
		return true
	}
	// The stream moved: the deal's expectation over its random positions.
	for _, h := range dealt {
		fillEven(gpus, slots, frac[int(h)*n:(int(h)+1)*n])
	}
	return false
}
