package costmodel

import (
	"fmt"
	"slices"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
)

// eplbDealSplit is SGLang's static table for a plan the stack computed by
// running EPLB itself (placement.Plan.StackEPLB; SGLang's init_by_eplb):
// the candidate lists are the algorithm's log2phy rows in its replica
// order, shared by every rank, and one random stream goes through every
// (layer, expert) where any rank is dealt (stackdispatch.SGLangInitByEPLB).
// It keeps, per (layer, expert), the GPU each rank's tokens go to and the
// bound plan's copies; a split asked for other copies is the deal's
// expectation and not exact (such a plan is no longer what the algorithm
// returned).
type eplbDealSplit struct {
	v      stackdispatch.SGLangVariant
	G, P   int
	E      int
	gpuOf  [][]int32 // [l·E+e][rank]: the GPU the table sends the rank's tokens to
	copies [][]int32 // [l·E+e]: the copies' GPUs, one entry per slot, ascending
}

// eplbCandidates returns SGLang's candidate lists for every row of the map
// (rows, moeRows as placement.SGLangRows gives them) from plan.StackEPLB:
// the MoE rows' log2phy and, for the other (dense) rows, Unrouted. It
// fails, naming the field, when the record does not match the plan.
func eplbCandidates(plan *placement.Plan, rows [][]int, moeRows []int) ([][][]int32, error) {
	st := plan.StackEPLB
	E, L := plan.Experts, len(plan.Layers)
	if !plan.IsGPUMajor() {
		return nil, fmt.Errorf("Plan.StackEPLB needs a GPU-major plan (slot s is SGLang's physical id s)")
	}
	if len(st.Log2Phy) != L {
		return nil, fmt.Errorf("Plan.StackEPLB.Log2Phy has %d layers, the plan %d", len(st.Log2Phy), L)
	}
	cands := make([][][]int32, len(rows))
	for l, row := range moeRows {
		lp := plan.Layers[l]
		if len(st.Log2Phy[l]) != E {
			return nil, fmt.Errorf("Plan.StackEPLB.Log2Phy[%d] has %d experts, the plan %d", l, len(st.Log2Phy[l]), E)
		}
		seen := 0
		for e, slots := range st.Log2Phy[l] {
			for _, s := range slots {
				if s < 0 || int(s) >= len(lp.SlotExpert) || int(lp.SlotExpert[s]) != e {
					return nil, fmt.Errorf("Plan.StackEPLB.Log2Phy[%d][%d] names slot %d, which does not hold expert %d", l, e, s, e)
				}
			}
			seen += len(slots)
		}
		if seen != len(lp.SlotExpert) {
			return nil, fmt.Errorf("Plan.StackEPLB.Log2Phy[%d] lists %d slots, the layer has %d", l, seen, len(lp.SlotExpert))
		}
		cands[row] = st.Log2Phy[l]
	}
	for r := range rows {
		if cands[r] != nil {
			continue
		}
		if len(st.Unrouted) != E {
			return nil, fmt.Errorf("Plan.StackEPLB.Unrouted has %d experts, need %d: decoder row %d has no MoE layer and SGLang runs EPLB on its zero counts", len(st.Unrouted), E, r)
		}
		cands[r] = st.Unrouted
	}
	return cands, nil
}

func newEPLBDealSplit(v stackdispatch.SGLangVariant, plan *placement.Plan, G, P int, rows [][]int, moeRows []int) (*eplbDealSplit, error) {
	cands, err := eplbCandidates(plan, rows, moeRows)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch (init_by_eplb): %w", v, err)
	}
	S := max(len(rows[0])/G, 1)
	table, err := stackdispatch.SGLangStaticTable(cands, G, S, P, v, stackdispatch.SGLangInitByEPLB)
	if err != nil {
		return nil, fmt.Errorf("costmodel: %s dispatch (init_by_eplb): %w", v, err)
	}
	E, L := plan.Experts, len(plan.Layers)
	d := &eplbDealSplit{v: v, G: G, P: P, E: E, gpuOf: make([][]int32, L*E), copies: make([][]int32, L*E)}
	for l, row := range moeRows {
		for e := range E {
			i := l*E + e
			d.gpuOf[i] = make([]int32, G)
			for h := range G {
				d.gpuOf[i][h] = table[h][row][e] / int32(S)
			}
			for _, s := range cands[row][e] {
				d.copies[i] = append(d.copies[i], int32(plan.Layers[l].SlotGPU[s]))
			}
			slices.Sort(d.copies[i])
		}
	}
	return d, nil
}

func (d *eplbDealSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	n := len(gpus)
	clear(frac[:d.G*n])
	i := l*d.E + e
	if i < len(d.copies) && sameCopies(d.copies[i], gpus, slots) {
		for h := range d.G {
			frac[h*n+slices.Index(gpus, d.gpuOf[i][h])] = 1
		}
		return true
	}
	// Other copies than the bound plan's: the deal's expectation.
	cands, S := physicalIDs(gpus, slots)
	for h := 0; h < d.G; h++ {
		near := stackdispatch.SGLangNearest(cands, h, S, d.P, d.v)
		if near < 0 {
			fillEven(gpus, slots, frac[h*n:(h+1)*n])
			continue
		}
		frac[h*n+slices.Index(gpus, near/int32(S))] = 1
	}
	return false
}

// sameCopies reports whether gpus with slots[i] copies on gpus[i] are the
// copies want lists (one GPU per slot, ascending).
func sameCopies(want, gpus, slots []int32) bool {
	tot := 0
	for _, s := range slots {
		tot += int(s)
	}
	if tot != len(want) {
		return false
	}
	for i, g := range gpus {
		lo, _ := slices.BinarySearch(want, g)
		hi := lo
		for hi < len(want) && want[hi] == g {
			hi++
		}
		if hi-lo != int(slots[i]) {
			return false
		}
	}
	return true
}
