package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

const flameTrace = "testdata/flame-moe-290m/trace.jsonl"

// stackFiles hold one FLAME placement (P = 72 on 8 ranks, decoder layers
// 2..9 of 10) in every stack's format, written by testdata/plans/stacks/gen.py
// without moetuner.
var stackFiles = []string{
	"testdata/plans/stacks/flame.sglang.json",
	"testdata/plans/stacks/flame.sglang.pt",
	"testdata/plans/stacks/flame.eplb.json",
	"testdata/plans/stacks/flame.trtllm.yaml",
	"testdata/plans/stacks/flame.vllm-map.json",
	"testdata/plans/stacks/flame.vllm-mapping.jsonl",
	"testdata/plans/stacks/flame.vllm-ascend.json",
}

// afterHeader drops the first line (it names the plan file).
func afterHeader(s string) string {
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

// TestEvalReplayStackFiles: eval and replay --backend sim run on every
// stack's file, and since the files hold one placement they report the same
// numbers, equal to the numbers for that placement in moetuner's own JSON.
// A reader that misplaces a slot, drops a dense row wrongly or keys a layer
// off by one changes them.
func TestEvalReplayStackFiles(t *testing.T) {
	chdirRoot(t)
	ref := filepath.Join(t.TempDir(), "flame.json")
	p, err := placement.ReadFileWith(stackFiles[0], placement.Layout{GPUs: 8, ModelLayers: 10, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}})
	require.NoError(t, err)
	require.NoError(t, placement.WriteFile(ref, p, placement.FormatJSON))

	code, wantEval, stderr := runCLI(t, "eval", "--trace", flameTrace, "--plan", ref)
	require.Equal(t, 0, code, stderr)
	code, wantReplay, stderr := runCLI(t, "replay", "--backend", "sim", "--trace", flameTrace, "--plan", ref)
	require.Equal(t, 0, code, stderr)
	for _, file := range stackFiles {
		t.Run(filepath.Base(file), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "eval", "--trace", flameTrace, "--plan", file)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stdout, "plan "+file)
			assert.Equal(t, afterHeader(wantEval), afterHeader(stdout))

			code, stdout, stderr = runCLI(t, "replay", "--backend", "sim", "--trace", flameTrace, "--plan", file)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, strings.Replace(wantReplay, ref, file, 1), stdout)
		})
	}
}

// TestPlanEveryFormat writes a replicated FLAME plan in every format plan
// writes and reads each back with eval: the same numbers as moetuner JSON.
func TestPlanEveryFormat(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	args := []string{"plan", "--trace", flameTrace, "--strategy", "eplb", "--redundant-slots", "8", "--quiet"}
	ref := filepath.Join(dir, "p.json")
	code, _, stderr := runCLI(t, append(args, "--out", ref)...)
	require.Equal(t, 0, code, stderr)
	code, want, stderr := runCLI(t, "eval", "--trace", flameTrace, "--plan", ref)
	require.Equal(t, 0, code, stderr)
	for _, name := range []string{"p.yaml", "p.sglang.json", "p.eplb.json", "p.vllm-map.json", "p.vllm-mapping.jsonl", "p.vllm-ascend.json", "p.trtllm.yaml", "p.pt"} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name)
			code, _, stderr := runCLI(t, append(args, "--out", out)...)
			require.Equal(t, 0, code, stderr)
			code, got, stderr := runCLI(t, "eval", "--trace", flameTrace, "--plan", out)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, afterHeader(want), afterHeader(got))
		})
	}
	// The SGLang map has FLAME's ten decoder layers, the dense two trivial.
	var m struct {
		P2L [][]int `json:"physical_to_logical_map"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "p.sglang.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &m))
	require.Len(t, m.P2L, 10)
	for l := range 2 {
		for s, e := range m.P2L[l] {
			require.Equal(t, s%64, e, "row %d slot %d", l, s)
		}
	}
	// TensorRT-LLM's lists are keyed by decoder layer.
	data, err = os.ReadFile(filepath.Join(dir, "p.trtllm.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(data), "num_slots: 72\ninitial_global_assignments:\n  2: [")
	assert.Contains(t, string(data), "\n  9: [")
	assert.NotContains(t, string(data), "ep_size")

	// The .pt form holds the same map as an int64 tensor.
	pt, err := placement.ReadFileWith(filepath.Join(dir, "p.pt"), placement.Layout{GPUs: 8, ModelLayers: 10, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}})
	require.NoError(t, err)
	js, err := placement.ReadFileWith(filepath.Join(dir, "p.sglang.json"), placement.Layout{GPUs: 8, ModelLayers: 10, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}})
	require.NoError(t, err)
	assert.Equal(t, js.Layers, pt.Layers)
}

// TestPlanDeepSeekSGLang is the command: DeepSeek-V3 on 4 nodes
// with 32 redundant slots written for SGLang has all 61 decoder layers,
// rows 0-2 SGLang's trivial map and rows 3-60 the plan.
func TestPlanDeepSeekSGLang(t *testing.T) {
	chdirRoot(t)
	trace := filepath.Join("..", "shared", "traces", "sglang-deepseek-v3-expert-counts", "prefill_in4096.json")
	if _, err := os.Stat(trace); err != nil {
		t.Skip("../shared/traces is absent")
	}
	dir := t.TempDir()
	sg, ref := filepath.Join(dir, "current.sglang.json"), filepath.Join(dir, "p.json")
	args := []string{"plan", "--trace", trace, "--nodes", "4", "--redundant-slots", "32", "--quiet"}
	code, _, stderr := runCLI(t, append(args, "--format", "sglang", "--out", sg)...)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, append(args, "--out", ref)...)
	require.Equal(t, 0, code, stderr)

	var m struct {
		P2L [][]int `json:"physical_to_logical_map"`
	}
	data, err := os.ReadFile(sg)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &m))
	require.Len(t, m.P2L, 61)
	for l, row := range m.P2L {
		require.Len(t, row, 288, "row %d", l)
	}
	for l := range 3 {
		for s, e := range m.P2L[l] {
			require.Equal(t, s%256, e, "dense row %d slot %d", l, s)
		}
	}
	plan, err := placement.ReadFile(ref)
	require.NoError(t, err)
	q := plan.GPUMajor()
	require.Len(t, q.Layers, 58)
	for i, lp := range q.Layers {
		row := make([]int, len(lp.SlotExpert))
		for s, e := range lp.SlotExpert {
			row[s] = int(e)
		}
		require.Equal(t, row, m.P2L[3+i], "MoE layer %d is decoder layer %d", i, 3+i)
	}

	// What the placement run today costs: eval reads it back for 32 GPUs.
	code, got, stderr := runCLI(t, "eval", "--trace", trace, "--plan", sg, "--nodes", "4", "--gpus-per-node", "8")
	require.Equal(t, 0, code, stderr)
	code, want, stderr := runCLI(t, "eval", "--trace", trace, "--plan", ref, "--nodes", "4", "--gpus-per-node", "8")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, afterHeader(want), afterHeader(got))
	code, _, stderr = runCLI(t, "replay", "--backend", "sim", "--trace", trace, "--plan", sg, "--nodes", "4")
	require.Equal(t, 0, code, stderr)
}

func TestStackErrors(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	// A model file that does not say its decoder layers, and a trace that
	// does not either: SGLang's map cannot be written, and plan says so
	// before it solves.
	model := filepath.Join(dir, "m.yaml")
	require.NoError(t, os.WriteFile(model, []byte("name: mix\nlayers: 32\nexperts: 8\ntop_k: 2\nhidden: 4096\nffn: 14336\nbytes_per_activation: 2\n"), 0o644))
	old := filepath.Join(dir, "old.sglang.json")
	require.NoError(t, os.WriteFile(old, []byte(`{"physical_to_logical_map": [[0,1,2,3,4,5,6,7,0,1,2,3,4,5,6,7],[0,1,2,3,4,5,6,7,0,1,2,3,4,5,6,7]]}`), 0o644))
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"gpus disagree", []string{"eval", "--trace", flameTrace, "--plan", "testdata/plans/stacks/flame.trtllm.yaml", "--gpus-per-node", "4"},
			"moetuner: testdata/plans/stacks/flame.trtllm.yaml records 8 GPUs (ep_size) but the cluster has 4 (1 nodes × 4 GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size\n"},
		{"layers unknown", []string{"plan", "--trace", "testdata/mixtral-8x7b/fiddler", "--model", model, "--format", "sglang", "--out", filepath.Join(dir, "x.sglang.json")},
			"moetuner: " + filepath.Join(dir, "x.sglang.json") + ": the file's layers are indexed by decoder layer, and neither the trace nor model \"mix\" says which of the model's decoder layers are its 32 MoE layers: use a trace that records them (SGLang dumps do), or pass --model with a preset or YAML file that sets decoder_layers (num_hidden_layers) and, when the MoE layers are not the last ones, moe_layer_ids\n"},
		{"one row per MoE layer", []string{"eval", "--trace", flameTrace, "--plan", old},
			"moetuner: " + old + ": physical_to_logical_map has 2 rows (SGLang needs one per decoder layer, dense ones included) but model \"flame-moe-290m\" has 10 decoder layers (decoder_layers); the file is for another model: give the --trace and --model it was made for, or make a plan for this model with moetuner plan\n"},
		{"wrong GPU count for a map", []string{"eval", "--trace", flameTrace, "--plan", "testdata/plans/stacks/flame.sglang.json", "--gpus-per-node", "4"},
			"moetuner: placement: sglang: physical_to_logical_map[2]: expert 38 is on rank 0 twice (slots 8 and 15 of 18 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than the 4 of --nodes × --gpus-per-node (file testdata/plans/stacks/flame.sglang.json)\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			assert.Equal(t, 1, code)
			assert.Equal(t, tc.want, withoutProgress(stderr))
			assert.Empty(t, stdout, "fails before any work is reported")
		})
	}
}

func TestComparePlanFiles(t *testing.T) {
	chdirRoot(t)
	js := filepath.Join(t.TempDir(), "c.json")
	code, stdout, stderr := runCLI(t, "compare", "--trace", flameTrace, "--redundant-slots", "8", "--strategies", "contiguous,eplb",
		"--plan", stackFiles[0], "--plan", stackFiles[3], "--json", js)
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `file:testdata/plans/stacks/flame.sglang.json +\d+ +1\.121 .* file +- +-\n`, stdout)
	assert.Contains(t, stdout, "file:testdata/plans/stacks/flame.trtllm.yaml")
	assert.Contains(t, stdout, "file: a --plan file, scored as it is (no solve).")
	var out struct {
		Results []jsonResult `json:"results"`
	}
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &out))
	require.Len(t, out.Results, 4)
	assert.Equal(t, "file", out.Results[2].Status)
	// One placement in two formats: one score.
	assert.Equal(t, out.Results[2].TimeSec, out.Results[3].TimeSec)

	code, _, stderr = runCLI(t, "compare", "--trace", flameTrace, "--plan", "testdata/plans/mixtral-joint.json")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "records 4 GPUs (gpus) but the cluster has 8")
}

func TestPlanFromStackFile(t *testing.T) {
	chdirRoot(t)
	out := filepath.Join(t.TempDir(), "next.trtllm.yaml")
	code, _, stderr := runCLI(t, "plan", "--trace", flameTrace, "--from", "testdata/plans/stacks/flame.trtllm.yaml",
		"--max-moves", "2", "--time-limit", "5s", "--out", out, "--quiet")
	require.Equal(t, 0, code, stderr)
	next, err := placement.ReadFileWith(out, placement.Layout{GPUs: 8, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}})
	require.NoError(t, err)
	cur, err := placement.ReadFileWith("testdata/plans/stacks/flame.trtllm.yaml", placement.Layout{})
	require.NoError(t, err)
	for l := range next.Layers {
		held := map[[2]int]bool{}
		for s, e := range cur.Layers[l].SlotExpert {
			held[[2]int{int(e), int(cur.Layers[l].SlotGPU[s])}] = true
		}
		changed := 0
		for s, e := range next.Layers[l].SlotExpert {
			if !held[[2]int{int(e), int(next.Layers[l].SlotGPU[s])}] {
				changed++
			}
		}
		assert.LessOrEqual(t, changed, 2, "layer %d: at most 2 slots change", l)
	}
}

func TestStatsLogicalCount(t *testing.T) {
	chdirRoot(t)
	out := filepath.Join(t.TempDir(), "lc.json")
	code, stdout, stderr := runCLI(t, "stats", flameTrace, "--out", out, "--format", "logical-count")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "wrote "+out+": logical_count of 10 rows × 64 experts")
	var m struct {
		LC [][]float64 `json:"logical_count"`
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &m))
	require.Len(t, m.LC, 10)
	for l, row := range m.LC {
		sum := 0.0
		for _, v := range row {
			sum += v
		}
		if l < 2 {
			assert.Zero(t, sum, "dense layer %d", l)
		} else {
			assert.Equal(t, 1024.0*6, sum, "MoE layer %d: 1024 tokens × top-6", l)
		}
	}
	// And it reads back as the same trace statistics.
	code, again, stderr := runCLI(t, "stats", out)
	require.Equal(t, 0, code, stderr)
	code, orig, _ := runCLI(t, "stats", flameTrace)
	require.Equal(t, 0, code)
	// The count columns agree; the pair columns need per-token paths,
	// which counts do not keep.
	counts := func(s string) []string {
		var rows []string
		for _, line := range strings.Split(s[strings.Index(s, "layer "):], "\n") {
			if f := strings.Fields(line); len(f) >= 7 {
				rows = append(rows, strings.Join(f[:7], " "))
			}
		}
		return rows
	}
	assert.Equal(t, counts(orig), counts(again))
	assert.Len(t, counts(again), 9)
}
