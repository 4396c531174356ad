package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

var tableRow = regexp.MustCompile(`^\s*(\S.*?)\s{2,}\d+\s+\d+\.\d{3}\s+\d+\.\d{3}\s`)

// tableRows returns the first column of compare's table: the rows
// between the header and the first line that is not a row.
func tableRows(stdout string) []string {
	var rows []string
	in := false
	for _, line := range strings.Split(stdout, "\n") {
		m := tableRow.FindStringSubmatch(line)
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "strategy "):
			in = true
		case in && m != nil:
			rows = append(rows, m[1])
		case in:
			return rows
		}
	}
	return rows
}

// TestComparePeerRowsByDefault: compare shows, besides the baselines and
// joint, the stacks' own algorithms (deepseek-vec, flashlb) with the same
// slots, labels the EPLB policy the stacks run by default (global here:
// the model has no expert groups) and says that the trace has no steps.
func TestComparePeerRowsByDefault(t *testing.T) {
	chdirRoot(t)
	js := filepath.Join(t.TempDir(), "c.json")
	code, stdout, stderr := runCLI(t, "compare", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--redundant-slots", "8", "--time-limit", "3s", "--json", js)
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	var v struct {
		Results []struct {
			Strategy     string `json:"strategy"`
			StackDefault bool   `json:"stack_default"`
		}
	}
	require.NoError(t, json.Unmarshal(data, &v))
	var defaults []string
	for _, r := range v.Results {
		if r.StackDefault {
			defaults = append(defaults, r.Strategy)
		}
	}
	assert.Equal(t, []string{"eplb"}, defaults)
	assert.Equal(t, []string{"contiguous", "round-robin", "greedy", "eplb (stack default)", "deepseek-vec", "flashlb", "joint"}, tableRows(stdout), stdout)
	assert.Contains(t, stderr, "moetuner: compare: deepseek-vec, flashlb see the trace's total load as one step: the trace records no steps")
	assert.Contains(t, stdout, "stack default: what SGLang and vLLM run with EPLB on unless told otherwise (SGLang --eplb-algorithm auto picks deepseek (global EPLB)")

	code, _, stderr = runCLI(t, "compare", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--strategies", "eplb,magic")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `unknown strategy "magic" (want joint, moetuner, greedy, eplb, eplb-hierarchical, deepseek-vec, deepseek-vec-hierarchical, flashlb, contiguous or round-robin)`)

	// Asked for by name, a policy the shape does not allow is an error.
	code, _, stderr = runCLI(t, "compare", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--strategies", "deepseek-vec-hierarchical")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `deepseek-vec-hierarchical needs expert groups that are a multiple of the 1 nodes (model "flame-moe-290m" has 0); pass --expert-groups`)
}

// TestPlanPeerStrategiesUseSteps: plan --strategy deepseek-vec and flashlb
// write exactly the ports' plans on the trace's per-step loads (a
// logical_count file with two steps), not on their sum, with the same
// --redundant-slots.
func TestPlanPeerStrategiesUseSteps(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	steps := filepath.Join(dir, "steps.json")
	stepLoad := [][][]float64{
		{{43, 75, 94, 87, 70, 23, 75, 15}},
		{{41, 89, 88, 81, 16, 28, 22, 27}},
		{{34, 51, 13, 44, 3, 94, 82, 3}},
	}
	require.NoError(t, os.WriteFile(steps, []byte(`{"logical_count": [[[43,75,94,87,70,23,75,15]],[[41,89,88,81,16,28,22,27]],[[34,51,13,44,3,94,82,3]]]}`), 0o644))
	st := &routing.Stats{Layers: 1, Experts: 8, StepLoad: stepLoad, Load: [][]float64{make([]float64, 8)}}
	for _, m := range stepLoad {
		for e, x := range m[0] {
			st.Load[0][e] += x
		}
	}
	// mixtral-8x7b: 4 GPUs of 2 experts; 4 redundant slots make 3 a GPU.
	want := map[string]func() (*placement.Plan, error){
		"deepseek-vec": func() (*placement.Plan, error) {
			return baseline.DeepSeekVec(st, 4, baseline.DeepSeekVecOptions{RedundantSlots: 4, FixDuplicates: true})
		},
		"deepseek-vec-hierarchical": func() (*placement.Plan, error) {
			return baseline.DeepSeekVec(st, 4, baseline.DeepSeekVecOptions{RedundantSlots: 4, Hierarchical: true, Groups: 2, Nodes: 1, FixDuplicates: true})
		},
		"flashlb": func() (*placement.Plan, error) {
			return baseline.FlashLB(st, 4, baseline.FlashLBOptions{RedundantSlots: 4})
		},
	}
	var plans []*placement.Plan
	for _, name := range []string{"deepseek-vec", "deepseek-vec-hierarchical", "flashlb"} {
		out := filepath.Join(dir, name+".json")
		args := []string{"plan", "--trace", steps, "--model", "mixtral-8x7b", "--redundant-slots", "4", "--strategy", name, "--out", out}
		if name == "deepseek-vec-hierarchical" {
			args = append(args, "--expert-groups", "2")
		}
		code, stdout, stderr := runCLI(t, args...)
		require.Equal(t, 0, code, "%s: %s", name, stderr)
		assert.Contains(t, stdout, "wrote "+out, name)
		note := name + " sees the trace's 3 steps"
		if name == "flashlb" {
			note = "flashlb sees the sum of the trace's 3 steps as one stage, as vllm-ascend's FlashLB does by default (max_stage_window 1)"
		}
		assert.Contains(t, stderr, "moetuner plan: "+note, name)
		got, err := placement.ReadFile(out)
		require.NoError(t, err, name)
		exp, err := want[name]()
		require.NoError(t, err, name)
		assert.Equal(t, exp.Layers[0].SlotExpert, got.Layers[0].SlotExpert, name)
		assert.Equal(t, exp.Layers[0].SlotGPU, got.Layers[0].SlotGPU, name)
		assert.Equal(t, 12, got.Slots(0), name)
		plans = append(plans, got)
	}

	// On the summed load alone deepseek-vec places differently: the plan
	// above used the steps. FlashLB, as vllm-ascend by default, sees their
	// sum as one stage.
	sum, err := baseline.DeepSeekVec(routing.StatsFromLoad(st.Load, 0), 4, baseline.DeepSeekVecOptions{RedundantSlots: 4, FixDuplicates: true})
	require.NoError(t, err)
	assert.NotEqual(t, sum.Layers[0].SlotExpert, plans[0].Layers[0].SlotExpert)
	sum, err = baseline.FlashLB(routing.StatsFromLoad(st.Load, 0), 4, baseline.FlashLBOptions{RedundantSlots: 4})
	require.NoError(t, err)
	assert.Equal(t, sum.Layers[0].SlotExpert, plans[2].Layers[0].SlotExpert)
}

// TestCompareStackDefaultHierarchical: for DeepSeek-V3 on 4 nodes the
// stacks run hierarchical EPLB (8 groups, a multiple of 4 nodes), and
// compare labels that row, not the global one.
func TestCompareStackDefaultHierarchical(t *testing.T) {
	chdirRoot(t)
	path := filepath.Join("..", "shared", "traces", "sglang-deepseek-v3-expert-counts", "prefill_in4096.json")
	if _, err := os.Stat(path); err != nil {
		t.Skip("../shared/traces is absent")
	}
	code, stdout, stderr := runCLI(t, "compare", "--trace", path, "--nodes", "4", "--redundant-slots", "32",
		"--strategies", "eplb,eplb-hierarchical,deepseek-vec,deepseek-vec-hierarchical,flashlb", "--quiet")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, []string{"eplb", "eplb-hierarchical (stack default)", "deepseek-vec", "deepseek-vec-hierarchical", "flashlb"}, tableRows(stdout), stdout)
	assert.Contains(t, stdout, "SGLang --eplb-algorithm auto picks deepseek_hierarchical: the model's 8 expert groups are a multiple of the 4 nodes")
}
