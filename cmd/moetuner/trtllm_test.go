package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// The TensorRT-LLM dumps of testdata/serving-stacks (make_trtllm.py): 128
// FLAME tokens recorded under a load_balancer config of 72 slots on 8
// ranks (trtllm_load_balancer.yaml), with raw ids (7ce477f), and on 4
// ranks without attention DP.
const (
	trtLB     = "testdata/serving-stacks/trtllm_load_balancer"
	trtLBPlan = "testdata/serving-stacks/trtllm_load_balancer.yaml"
)

// TestTRTLLMLoadBalancerCLI: slot statistics with --model fail with a hint
// that names the load balancer and the flag to give; with the serving
// placement (stats --plan, eval --plan, plan --from) they are folded back
// to the model's 64 experts, and a note says so.
func TestTRTLLMLoadBalancerCLI(t *testing.T) {
	chdirRoot(t)
	code, _, stderr := runCLI(t, "stats", "--model", "flame-moe-290m", trtLB)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "meta_info.json says 72 experts, but --model has 64: TensorRT-LLM's load balancer records physical slots, and num_experts is then its num_slots: give the placement it was serving with --plan (stats, eval) or --from (plan)")

	// The same placement as a vLLM map, which does not record its GPU
	// count: stats needs --ep-size for it, and a cluster that cannot hold
	// it says so.
	lb, err := placement.ReadFileWith(trtLBPlan, placement.Layout{GPUs: 8})
	require.NoError(t, err)
	vmap := filepath.Join(t.TempDir(), "lb.vllm-map.json")
	require.NoError(t, placement.WriteFile(vmap, lb, placement.FormatVLLMMap))
	code, _, stderr = runCLI(t, "stats", "--plan", vmap, trtLB)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--plan "+vmap+" does not record its GPU count: add --ep-size N")
	code, _, stderr = runCLI(t, "stats", "--plan", vmap, "--ep-size", "8", trtLB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "folded back to 64 logical experts through --plan "+vmap)
	code, _, stderr = runCLI(t, "eval", "--trace", trtLB, "--plan", vmap, "--gpus-per-node", "5", "--model", "flame-moe-290m")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "(--plan "+vmap+" could not be read as the placement that was serving: ")

	note := "moetuner: note: " + trtLB + " counts 72 physical slots per layer (TensorRT-LLM's load balancer records slot ids): folded back to 64 logical experts through "
	code, stdout, stderr := runCLI(t, "stats", "--model", "flame-moe-290m", "--plan", trtLBPlan, trtLB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, note+"--plan "+trtLBPlan)
	assert.Contains(t, stdout, "tokens 128  layers 8  experts 64  top-k 6")

	code, stdout, stderr = runCLI(t, "eval", "--trace", trtLB, "--plan", trtLBPlan)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, note+"--plan "+trtLBPlan)
	assert.Contains(t, stdout, "model flame-moe-290m")

	out := filepath.Join(t.TempDir(), "next.trtllm.yaml")
	code, _, stderr = runCLI(t, "plan", "--trace", trtLB, "--from", trtLBPlan, "--strategy", "greedy", "--out", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, note+"--from "+trtLBPlan)

	// Without replicas eval's --plan is only the plan to score: the
	// dump of logical ids is read as it is, with no note.
	code, _, stderr = runCLI(t, "eval", "--trace", "testdata/serving-stacks/trtllm_raw", "--plan", out)
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, stderr, "physical slots")
}

// TestTRTLLMNotesCLI: a dump taken without attention DP, and a stray
// .safetensors file, are each reported on stderr.
func TestTRTLLMNotesCLI(t *testing.T) {
	chdirRoot(t)
	code, stdout, stderr := runCLI(t, "stats", "testdata/serving-stacks/trtllm_no_attention_dp")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "moetuner: note: testdata/serving-stacks/trtllm_no_attention_dp: every rank recorded the same routing, as TensorRT-LLM does without enable_attention_dp")
	assert.Contains(t, stdout, "tokens 32 ")

	dir := t.TempDir()
	for _, name := range []string{"meta_info.json", "rank0.safetensors", "rank0_raw.safetensors"} {
		data, err := os.ReadFile(filepath.Join("testdata/serving-stacks/trtllm_raw", name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	// A weights file: 8-byte header length, header, data.
	hdr := `{"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}`
	stray := append([]byte{byte(len(hdr)), 0, 0, 0, 0, 0, 0, 0}, hdr+"\x01\x00\x00\x00"...)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter.safetensors"), stray, 0o644))
	code, _, stderr = runCLI(t, "stats", dir)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, 1, strings.Count(stderr, "moetuner: note: "+filepath.Join(dir, "adapter.safetensors")+" skipped: not one of TensorRT-LLM's statistics files"))
}

// TestWriteTopology: plan --write-topology writes the cluster's EP-rank
// costs in picoseconds per byte: 0 on the diagonal, one-way NVLink (900
// GB/s bidirectional: 2.22 ps/B) within a node, the NIC (400 Gbit/s: 20
// ps/B) across nodes, in EP-rank order.
func TestWriteTopology(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	topo := filepath.Join(dir, "topology.json")
	code, stdout, stderr := runCLI(t, "plan", "--trace", flameTrace, "--cluster", "2xh100x8", "--strategy", "greedy",
		"--out", filepath.Join(dir, "p.json"), "--write-topology", topo)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "wrote "+topo+": rank_cost_matrix of 16 EP ranks, picoseconds per byte (2.222 within a node, 20 across nodes)")
	data, err := os.ReadFile(topo)
	require.NoError(t, err)
	var doc struct {
		Cost [][]float64 `json:"rank_cost_matrix"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Len(t, doc.Cost, 16)
	for i, row := range doc.Cost {
		require.Len(t, row, 16)
		for j, v := range row {
			switch {
			case i == j:
				assert.Zero(t, v)
			case i/8 == j/8:
				assert.InDelta(t, 1e12/450e9, v, 1e-12)
			default:
				assert.InDelta(t, 20.0, v, 1e-12)
			}
		}
	}

	// A cluster without the bandwidths cannot say what a byte costs.
	_, err = rankCosts(costmodel.Cluster{Name: "x", Nodes: 2, GPUsPerNode: 8, NVLinkGBps: 900})
	assert.ErrorContains(t, err, "--write-topology: cluster \"x\" has no NIC bandwidth (nic_gbps) for its 2 nodes")
	_, err = rankCosts(costmodel.Cluster{Name: "y", Nodes: 1, GPUsPerNode: 8})
	assert.ErrorContains(t, err, "no NVLink bandwidth")
}

// TestTRTLLMSlotsKeepsSameRankCopies: a load-balancer YAML is read in
// TensorRT-LLM's slot order, two copies of one expert on one rank kept
// as two slots (a Plan would merge them and lose the numbering).
func TestTRTLLMSlotsKeepsSameRankCopies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dup.trtllm.yaml")
	require.NoError(t, os.WriteFile(path, []byte("num_slots: 4\ninitial_global_assignments:\n  3: [0, 0, 1, 2]\nlayer_updates_per_iter: 0\n"), 0o644))
	rows, ok := trtllmSlots(path)
	require.True(t, ok)
	assert.Equal(t, [][]routing.Expert{{0, 0, 1, 2}}, rows)
	assert.True(t, replicated(rows))
	_, ok = trtllmSlots("testdata/plans/stacks/flame.vllm-map.json")
	assert.False(t, ok)
}
