package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --json writes what a strategy leaves unset (NaN: no ILP, no bound) as
// null, as solver.Result's own JSON does, and every such key is present:
// a heuristic's gap reads null, joint's proven gap a number (0 included,
// which the old encoding left out as if no ILP had run).
func TestCompareJSONNulls(t *testing.T) {
	chdirRoot(t)
	js := filepath.Join(t.TempDir(), "c.json")
	code, _, stderr := runCLI(t, "compare", "--strategies", "greedy,joint", "--effort", "1", "--json", js)
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Len(t, doc.Results, 2)
	unset := []string{"model_objective_sec", "bound_sec", "gap", "cost_bound_sec", "cost_gap", "stage1_objective", "remote_bound_per_token_layer"}
	greedy, joint := doc.Results[0], doc.Results[1]
	require.Equal(t, "greedy", greedy["strategy"])
	require.Equal(t, "joint", joint["strategy"])
	for _, k := range unset {
		v, ok := greedy[k]
		assert.True(t, ok, "greedy: %s is written", k)
		assert.Nil(t, v, "greedy: %s is null", k)
	}
	for _, k := range []string{"model_objective_sec", "bound_sec", "gap"} {
		v, ok := joint[k].(float64)
		assert.True(t, ok, "joint: %s is a number, have %v", k, joint[k])
		assert.GreaterOrEqual(t, v, 0.0, k)
	}
	assert.Nil(t, joint["stage1_objective"], "joint has no ILP 1")
}
