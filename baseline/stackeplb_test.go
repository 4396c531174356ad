package baseline

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

// int32Rows converts EPLBMaps.Log2Phy rows ([E][X], -1 padded) to
// StackEPLB's form (the valid entries).
func int32Rows(rows [][]int) [][]int32 {
	out := make([][]int32, len(rows))
	for e, r := range rows {
		out[e] = []int32{}
		for _, p := range r {
			if p >= 0 {
				out[e] = append(out[e], int32(p))
			}
		}
	}
	return out
}

// TestStackEPLBIsLog2Phy: with StackEPLB, EPLB and DeepSeekVec record
// exactly the log2phy rows RebalanceExperts and RebalanceExpertsVec return
// (the replica order the Python code scatters), where no duplicate was
// repaired; Unrouted is the algorithm's log2phy for an all-zero row; where
// FixDuplicates swapped slots every copy keeps its replica index, so each
// row still lists exactly the expert's slots.
func TestStackEPLBIsLog2Phy(t *testing.T) {
	exact, unsorted := 0, 0
	defer func() {
		// The comparison with the reference ran, on rows whose replica
		// order is not ascending (what sorting the slots would give).
		require.Positive(t, exact, "no plan without repaired duplicates")
		require.Positive(t, unsorted, "every log2phy row ascending: the order is untested")
	}()
	for seed := range uint64(6) {
		w := [][]float64{zipfLayer(seed), zipfLayer(seed + 100)}
		st := routing.StatsFromLoad(w, 8)
		for _, hier := range []bool{false, true} {
			name := fmt.Sprintf("seed %d hierarchical %v", seed, hier)
			groups := 1
			if hier {
				groups = 8
			}
			p, err := EPLB(st, 32, EPLBOptions{RedundantSlots: 32, Groups: groups, Nodes: 2, FixDuplicates: true, StackEPLB: true})
			require.NoError(t, err, name)
			ref, err := RebalanceExperts(w, 288, groups, 2, 32)
			require.NoError(t, err)
			zero, err := RebalanceExperts([][]float64{make([]float64, 256)}, 288, groups, 2, 32)
			require.NoError(t, err)
			require.Equal(t, int32Rows(zero.Log2Phy[0]), p.StackEPLB.Unrouted, name)
			exact, unsorted = exact+count(p.Meta["duplicates_fixed"] == ""), unsorted+unsortedRows(p.StackEPLB.Log2Phy)
			checkLog2Phy(t, name, p.Meta["duplicates_fixed"] == "", ref.Log2Phy, p.StackEPLB.Log2Phy, p.Layers[0].SlotExpert, p.Layers[1].SlotExpert)

			v, err := DeepSeekVec(st, 32, DeepSeekVecOptions{RedundantSlots: 32, Hierarchical: hier, Groups: 8, Nodes: 2, FixDuplicates: true, StackEPLB: true})
			require.NoError(t, err, name)
			nodes := 1
			if hier {
				nodes = 2
			}
			vref, err := RebalanceExpertsVec([][][]float64{w}, 288, 9, 8, nodes, hier)
			require.NoError(t, err)
			vzero, err := RebalanceExpertsVec([][][]float64{{make([]float64, 256)}}, 288, 9, 8, nodes, hier)
			require.NoError(t, err)
			require.Equal(t, int32Rows(vzero.Log2Phy[0]), v.StackEPLB.Unrouted, "deepseek-vec "+name)
			exact, unsorted = exact+count(v.Meta["duplicates_fixed"] == ""), unsorted+unsortedRows(v.StackEPLB.Log2Phy)
			checkLog2Phy(t, "deepseek-vec "+name, v.Meta["duplicates_fixed"] == "", vref.Log2Phy, v.StackEPLB.Log2Phy, v.Layers[0].SlotExpert, v.Layers[1].SlotExpert)
		}
	}
}

// checkLog2Phy requires got to list, per layer and expert, exactly the
// slots of rows holding that expert, and to equal ref where exact.
func checkLog2Phy(t *testing.T, name string, exact bool, ref [][][]int, got [][][]int32, rows ...[]routing.Expert) {
	t.Helper()
	for l, row := range rows {
		n := 0
		for e, slots := range got[l] {
			for _, s := range slots {
				require.Equal(t, routing.Expert(e), row[s], "%s: layer %d expert %d lists slot %d", name, l, e, s)
			}
			n += len(slots)
		}
		require.Equal(t, len(row), n, "%s: layer %d lists every slot once", name, l)
		if exact {
			require.Equal(t, int32Rows(ref[l]), got[l], "%s: layer %d", name, l)
		}
	}
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

func unsortedRows(rows [][][]int32) int {
	n := 0
	for _, layer := range rows {
		for _, r := range layer {
			n += count(!slices.IsSorted(r))
		}
	}
	return n
}
