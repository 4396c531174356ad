package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

const vllmMeta = "testdata/serving-stacks/vllm_eplb_load_meta.jsonl"

// TestVLLMLoadMetaCLI: the eplb_load_meta record (8 ranks on 2 nodes, 1
// group, 8 redundant experts) sets the cluster and the redundant slots;
// a flag that says otherwise is an error naming the flag and the file.
func TestVLLMLoadMetaCLI(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "plan", "--trace", vllmMeta, "--strategy", "eplb", "--out", filepath.Join(dir, "p.json"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "moetuner: note: --trace "+vllmMeta+" records its deployment (vLLM's eplb_load_meta): 8 ranks on 2 nodes, 1 expert groups, 8 redundant experts; planned for it")
	assert.Contains(t, stdout, "eplb placement of 8 layers × 64 experts on 8 GPUs (2 nodes)")
	p, err := placement.ReadFile(filepath.Join(dir, "p.json"))
	require.NoError(t, err)
	assert.Equal(t, 72, p.Slots(0), "the recorded 8 redundant slots")

	code, _, stderr = runCLI(t, "eval", "--trace", vllmMeta, "--plan", filepath.Join(dir, "p.json"))
	require.Equal(t, 0, code, stderr)

	where := "--trace " + vllmMeta + " (line 1, vLLM's eplb_load_meta)"
	for _, tc := range []struct {
		flags []string
		msg   string
	}{
		{[]string{"--nodes", "1"}, "--nodes 1, but " + where + " records num_nodes 2"},
		{[]string{"--gpus-per-node", "8"}, "--gpus-per-node 8, but " + where + " records num_ranks 8 on num_nodes 2 (4 per node)"},
		{[]string{"--cluster", "2xh100x8"}, "--cluster 2xh100x8 has 16 GPUs (2 nodes × 8), but " + where + " records num_ranks 8 on num_nodes 2: add --nodes 2 --gpus-per-node 4"},
		{[]string{"--redundant-slots", "0"}, "--redundant-slots 0, but " + where + " records num_redundant_experts 8"},
		{[]string{"--expert-groups", "4"}, "--expert-groups 4, but " + where + " records num_groups 1"},
	} {
		args := append([]string{"plan", "--trace", vllmMeta, "--strategy", "eplb", "--out", filepath.Join(dir, "q.json")}, tc.flags...)
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, 1, code, tc.flags)
		assert.Contains(t, stderr, tc.msg)
	}
	// Flags that agree are fine.
	code, _, stderr = runCLI(t, "plan", "--trace", vllmMeta, "--strategy", "eplb", "--out", filepath.Join(dir, "r.json"),
		"--nodes", "2", "--gpus-per-node", "4", "--redundant-slots", "8", "--expert-groups", "1")
	require.Equal(t, 0, code, stderr)
}
