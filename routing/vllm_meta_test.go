package routing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVLLMLoadMeta reads vLLM #41141's newer stats file
// (make_vllm_meta.py): the eplb_load_meta record becomes the Deployment,
// the eplb_load_stats records the logical loads per step.
func TestVLLMLoadMeta(t *testing.T) {
	sets := flameSets(t)
	path := testdataPath(t, "serving-stacks", "vllm_eplb_load_meta.jsonl")
	src, err := Load(path, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatVLLMLoadStats, src.Format)
	assert.Equal(t, &Deployment{File: path, Line: 1, Model: "flame-moe-290m", Ranks: 8, Nodes: 2, Groups: 1, RedundantExperts: 8}, src.Deployment)
	s := src.Stats
	assert.Equal(t, 64, s.Experts)
	assert.Equal(t, recount(sets, span(0, 128)), s.Load)
	require.Len(t, s.StepLoad, 4)
	assert.Equal(t, recount(sets, span(32, 64)), s.StepLoad[1])

	// The PR's first files, without the meta record, record no deployment.
	old, err := Load(testdataPath(t, "serving-stacks", "vllm_eplb_load_stats.jsonl"), LoadOptions{})
	require.NoError(t, err)
	assert.Nil(t, old.Deployment)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	meta, stats := lines[0], strings.Join(lines[1:], "")
	for name, tc := range map[string]struct {
		text, msg string
	}{
		"second meta":       {meta + meta + stats, "stats.jsonl:2: record_type: a second eplb_load_meta record (the first is on line 1)"},
		"meta after stats":  {lines[1] + meta + strings.Join(lines[2:], ""), "stats.jsonl:2: record_type: eplb_load_meta after the eplb_load_stats record on line 1"},
		"num_layers":        {strings.Replace(meta, `"num_layers": 8`, `"num_layers": 9`, 1) + stats, "stats.jsonl:1: num_layers: 9, but the eplb_load_stats records have 8 layers"},
		"num_redundant":     {strings.Replace(meta, `"num_redundant_experts": 8`, `"num_redundant_experts": 4`, 1) + stats, "num_redundant_experts: 4, but expert_load has 72 slots for 64 logical experts (p2l_map): 8 redundant"},
		"num_ranks":         {strings.Replace(meta, `"num_ranks": 8`, `"num_ranks": 7`, 1) + stats, "num_nodes: 2 nodes do not divide 7 ranks evenly"},
		"ranks and slots":   {strings.Replace(meta, `"num_ranks": 8`, `"num_ranks": 16`, 1) + stats, "num_ranks: 16 ranks do not divide the 72 physical slots"},
		"num_groups":        {strings.Replace(meta, `"num_groups": 1`, `"num_groups": 5`, 1) + stats, "num_groups: 5 groups do not divide 64 logical experts"},
		"missing num_nodes": {strings.Replace(meta, `"num_nodes": 2, `, ``, 1) + stats, "stats.jsonl:1: num_nodes: missing from the eplb_load_meta record"},
		"zero ranks":        {strings.Replace(meta, `"num_ranks": 8`, `"num_ranks": 0`, 1) + stats, "num_ranks: 0 out of range"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "stats.jsonl")
			require.NoError(t, os.WriteFile(p, []byte(tc.text), 0o644))
			_, err := Load(p, LoadOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}
