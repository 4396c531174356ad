package placement

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sglangLoadRankCostMatrix re-implements load_rank_cost_matrix and
// _validate_rank_cost_matrix of sglang/srt/eplb/topology.py (PR #37923):
// a JSON object with "rank_cost_matrix" (or the bare array), a
// rectangular numeric array, square, at least one rank, the EP size when
// given, finite and non-negative, zero diagonal.
func sglangLoadRankCostMatrix(data []byte, expectedRanks int) ([][]float64, error) {
	var top any
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("EPLB topology file is not valid JSON")
	}
	if m, ok := top.(map[string]any); ok {
		v, ok := m["rank_cost_matrix"]
		if !ok {
			return nil, fmt.Errorf("topology JSON must contain rank_cost_matrix")
		}
		top = v
	}
	rows, ok := top.([]any)
	if !ok {
		return nil, fmt.Errorf("rank_cost_matrix must be square")
	}
	var out [][]float64
	for _, r := range rows {
		cells, ok := r.([]any)
		if !ok {
			return nil, fmt.Errorf("rank_cost_matrix must be a rectangular numeric array")
		}
		var row []float64
		for _, c := range cells {
			f, ok := c.(float64)
			if !ok {
				return nil, fmt.Errorf("rank_cost_matrix must be a rectangular numeric array")
			}
			row = append(row, f)
		}
		if len(out) > 0 && len(row) != len(out[0]) {
			return nil, fmt.Errorf("rank_cost_matrix must be a rectangular numeric array")
		}
		out = append(out, row)
	}
	if len(out) == 0 || len(out[0]) != len(out) {
		if len(out) == 0 {
			return nil, fmt.Errorf("rank_cost_matrix must contain at least one rank")
		}
		return nil, fmt.Errorf("rank_cost_matrix must be square")
	}
	if expectedRanks > 0 && len(out) != expectedRanks {
		return nil, fmt.Errorf("rank_cost_matrix size does not match the EP group: matrix=%d expected=%d", len(out), expectedRanks)
	}
	for i, row := range out {
		for j, v := range row {
			if math.IsInf(v, 0) || math.IsNaN(v) || v < 0 {
				return nil, fmt.Errorf("rank_cost_matrix must be finite and non-negative")
			}
			if i == j && v != 0 {
				return nil, fmt.Errorf("rank_cost_matrix diagonal must be zero")
			}
		}
	}
	return out, nil
}

func TestEncodeRankCostMatrix(t *testing.T) {
	cost := [][]float64{{0, 1.0 / 450, 0.02}, {1.0 / 450, 0, 0.02}, {0.02, 0.02, 0}}
	data, err := EncodeRankCostMatrix(cost)
	require.NoError(t, err)
	got, err := sglangLoadRankCostMatrix(data, 3)
	require.NoError(t, err)
	assert.Equal(t, cost, got, "the costs read back exactly")

	path := filepath.Join(t.TempDir(), "topology.json")
	require.NoError(t, WriteRankCostMatrix(path, cost))
	file, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, data, file)

	for name, tc := range map[string]struct {
		cost [][]float64
		msg  string
	}{
		"empty":      {nil, "no ranks"},
		"not square": {[][]float64{{0, 1}, {1, 0}, {1, 1}}, "row 0 has 2 entries for 3 ranks"},
		"ragged":     {[][]float64{{0, 1}, {1}}, "row 1 has 1 entries for 2 ranks"},
		"negative":   {[][]float64{{0, -1}, {1, 0}}, "rank_cost_matrix[0][1] is -1"},
		"infinite":   {[][]float64{{0, math.Inf(1)}, {1, 0}}, "finite, non-negative"},
		"nan":        {[][]float64{{0, 1}, {math.NaN(), 0}}, "finite, non-negative"},
		"diagonal":   {[][]float64{{0, 1}, {1, 0.5}}, "zero diagonal"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := EncodeRankCostMatrix(tc.cost)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
			path := filepath.Join(t.TempDir(), "t.json")
			require.Error(t, WriteRankCostMatrix(path, tc.cost))
			_, statErr := os.Stat(path)
			assert.True(t, os.IsNotExist(statErr), "nothing written")
		})
	}

	// The checker itself refuses what SGLang refuses.
	for _, bad := range []string{`{"rank_cost_matrix": [[0, 1], [1, 1]]}`, `{"rank_cost_matrix": [[0, 1]]}`, `{"x": []}`, `{"rank_cost_matrix": [[0, -2], [1, 0]]}`, `{"rank_cost_matrix": []}`} {
		_, err := sglangLoadRankCostMatrix([]byte(bad), 0)
		assert.Error(t, err, bad)
	}
}
