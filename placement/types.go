package placement

import "github.com/moetuner/moetuner/routing"

// GPU is an expert-parallel rank, 0-based. GPU g lives on node g/GPUsPerNode.
type GPU int

// Plan places the physical expert slots of every MoE layer on GPUs.
type Plan struct {
	// GPUs is the number of expert-parallel ranks.
	GPUs int
	// Experts is the number of logical experts per layer.
	Experts int
	// Layers holds one LayerPlan per MoE layer.
	Layers []LayerPlan
	// Strategy names what produced the plan ("joint", "contiguous", ...);
	// informational.
	Strategy string
	// Meta records provenance (flow, objective, source trace, ...) as
	// free-form key/value pairs; nil and empty are equivalent. Writers emit
	// the keys sorted.
	Meta map[string]string
	// StackEPLB, when set, says the plan is what the serving stack computes
	// itself by running its EPLB algorithm (SGLang's init_by_eplb, at
	// startup from a logical_count or at a rebalance) rather than a map it
	// loads from a file (init_by_mapping, what nil means and what every
	// file moetuner writes is). SGLang's static dispatch then deals it as
	// init_by_eplb (costmodel.NewSplitter). Files do not record it; Equal
	// ignores it and Clone copies it.
	StackEPLB *StackEPLB
}

// StackEPLB is what SGLang's init_by_eplb takes from its EPLB algorithm
// beyond the physical_to_logical_map: the log2phy rows, each expert's
// physical slots in the algorithm's replica order (deepseek.py scatters
// physical id p to log2phy[layer][phy2log[p]][phyrank[p]]), which become
// the candidate lists of its dispatch table unchanged.
type StackEPLB struct {
	// Log2Phy[l][e] lists the slots of plan layer l holding expert e in
	// replica order; slot s is LayerPlan.SlotExpert[s] and the plan's slots
	// must be GPU-major, so that s is SGLang's physical id.
	Log2Phy [][][]int32
	// Unrouted is the algorithm's log2phy ([expert] -> slots) for a decoder
	// layer no token is routed through: SGLang runs EPLB on every decoder
	// layer's row of logical_count, and a dense layer's row is all zeros.
	// Its deals draw from the same random stream before the MoE rows that
	// follow. Nil when unknown; a splitter whose layout has dense rows then
	// fails.
	Unrouted [][]int32
}

// clone returns a deep copy of s (nil for nil).
func (s *StackEPLB) clone() *StackEPLB {
	if s == nil {
		return nil
	}
	c := &StackEPLB{Log2Phy: make([][][]int32, len(s.Log2Phy)), Unrouted: cloneRows(s.Unrouted)}
	for l, rows := range s.Log2Phy {
		c.Log2Phy[l] = cloneRows(rows)
	}
	return c
}

func cloneRows(rows [][]int32) [][]int32 {
	if rows == nil {
		return nil
	}
	out := make([][]int32, len(rows))
	for i, r := range rows {
		out[i] = append([]int32(nil), r...)
	}
	return out
}

// LayerPlan maps the physical slots of one layer: slot s holds logical expert
// SlotExpert[s] on GPU SlotGPU[s]. With one copy per expert there are
// Experts slots; replication adds slots.
type LayerPlan struct {
	SlotExpert []routing.Expert
	SlotGPU    []GPU
	// SlotShare, when set, is the fraction of its expert's tokens each slot
	// serves (the copies of an expert add up to 1), as a dispatch-time
	// split such as SGLang's LP would send them; nil means every copy
	// serves an even share, as vLLM and SGLang's static dispatch do.
	SlotShare []float64
}
