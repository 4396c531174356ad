package baseline

import "github.com/moetuner/moetuner/placement"

// What SGLang deals from when it runs an EPLB algorithm itself
// (ExpertLocationMetadata.init_by_eplb, python/sglang/srt/eplb/
// expert_location.py at sgl-project/sglang@01fec5c2e61f9568c41a6e1d4fd5ac46c88504f1):
// the algorithm's logical_to_all_physical_map goes to
// compute_logical_to_rank_dispatch_physical_map unchanged (no
// _compute_logical_to_all_physical_map), and its rows are log2phy as the
// algorithm builds it. deepseek.py (eplb_algorithms/deepseek.py at
// sgl-project/sglang@06120cc8d77b198b925c6a04ef52ef4e218078f4) scatters
// physical id p to log2phy[layer][phy2log[p]][phyrank[p]], phyrank being
// the replica index replicate_experts gave the copy (0 for the first,
// then in the order the redundant copies were added), carried through the
// packing; deepseek_vec.py (at 68836b60f99d117ec96b5c8d7e49400724f25aca)
// writes logical_to_physical_map[..., redundancy_count] as it adds a copy
// and renumbers the slots through the snake, so its rows are in the same
// replica order. Both ports here keep that index per slot (rank).
// logical_count has one row per decoder layer
// (ModelConfigForExpertLocation.num_layers), so the algorithm also runs
// on the all-zero rows of the dense layers: StackEPLB.Unrouted.

// log2phyRows returns [L][E] -> the slots (of L rows of R = len/L slots,
// phy2log and rank flat [L*R]) holding each expert, in replica order:
// slot p is entry rank[p] of its expert's row.
func log2phyRows[T ~int](L, E int, phy2log []T, rank []int) [][][]int32 {
	R := len(phy2log) / L
	out := make([][][]int32, L)
	for l := range L {
		out[l] = make([][]int32, E)
		cnt := make([]int, E)
		for p := l * R; p < (l+1)*R; p++ {
			cnt[phy2log[p]]++
		}
		for e := range E {
			out[l][e] = make([]int32, cnt[e])
		}
		for p := l * R; p < (l+1)*R; p++ {
			out[l][phy2log[p]][rank[p]] = int32(p - l*R)
		}
	}
	return out
}

// vecStackEPLB is Plan.StackEPLB for a deepseek_vec plan p of shape s whose
// slots carry rank (flat [L*P]); Unrouted runs deepseek_vec on s.steps
// all-zero steps of one layer.
func vecStackEPLB(s vecShape, p *placement.Plan, rank []int) *placement.StackEPLB {
	L, E := s.layers, s.experts
	slot := make([]int, 0, L*s.phys)
	for _, lp := range p.Layers {
		for _, e := range lp.SlotExpert {
			slot = append(slot, int(e))
		}
	}
	one := s
	one.layers = 1
	zero := make([][][]float64, s.steps)
	for st := range zero {
		zero[st] = [][]float64{make([]float64, E)}
	}
	zp, zr, _ := runVec(one, zero)
	return &placement.StackEPLB{Log2Phy: log2phyRows(L, E, slot, rank), Unrouted: log2phyRows(1, E, zp, zr)[0]}
}
