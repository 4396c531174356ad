package placement

import (
	"fmt"
	"math"
	"strconv"
)

// EncodeRankCostMatrix returns SGLang's EPLB topology file
// ({"rank_cost_matrix": [[...], ...]}) for cost[i][j], the cost of sending
// one unit of traffic from EP rank i to EP rank j, ranks in EP-rank order.
// SGLang's topology-aware EPLB (PR #37923: --eplb-algorithm
// topology_aware --eplb-topology FILE) loads it with
// sglang/srt/eplb/topology.py load_rank_cost_matrix, which requires a
// square matrix of at least one rank, finite non-negative entries and a
// zero diagonal; only the ratios between entries affect its placement.
// EncodeRankCostMatrix checks the same and fails rather than write a file
// SGLang refuses. Entries are written with the shortest decimal that reads
// back exactly, one row per line.
func EncodeRankCostMatrix(cost [][]float64) ([]byte, error) {
	n := len(cost)
	if n == 0 {
		return nil, fmt.Errorf("placement: rank_cost_matrix: no ranks; SGLang needs one row per EP rank")
	}
	for i, row := range cost {
		if len(row) != n {
			return nil, fmt.Errorf("placement: rank_cost_matrix: row %d has %d entries for %d ranks; SGLang needs a square matrix", i, len(row), n)
		}
		for j, v := range row {
			switch {
			case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
				return nil, fmt.Errorf("placement: rank_cost_matrix[%d][%d] is %v; SGLang needs finite, non-negative costs", i, j, v)
			case i == j && v != 0:
				return nil, fmt.Errorf("placement: rank_cost_matrix[%d][%d] is %v; SGLang needs a zero diagonal (a rank sends to itself for free)", i, j, v)
			}
		}
	}
	b := []byte("{\"rank_cost_matrix\": [\n")
	for i, row := range cost {
		b = append(b, "  ["...)
		for j, v := range row {
			if j > 0 {
				b = append(b, ", "...)
			}
			b = strconv.AppendFloat(b, v, 'g', -1, 64)
		}
		b = append(b, ']')
		if i < n-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	return append(b, "]}\n"...), nil
}

// WriteRankCostMatrix writes EncodeRankCostMatrix(cost) to path
// atomically; on error nothing is written.
func WriteRankCostMatrix(path string, cost [][]float64) error {
	data, err := EncodeRankCostMatrix(cost)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, data)
}
