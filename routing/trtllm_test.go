package routing

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trtExpected is testdata/serving-stacks/trtllm_expected.json, written by
// make_trtllm.py with the fixtures.
type trtExpected struct {
	LoadBalancer struct {
		TokenOrder map[string][]int `json:"token_order"`
		SlotLoad   [][]float64      `json:"slot_load_moe_layers"`
	} `json:"trtllm_load_balancer"`
	Raw struct {
		TokenOrder map[string][]int `json:"token_order"`
	} `json:"trtllm_raw"`
}

func readTRTExpected(t *testing.T) trtExpected {
	t.Helper()
	data, err := os.ReadFile(testdataPath(t, "serving-stacks", "trtllm_expected.json"))
	require.NoError(t, err)
	var e trtExpected
	require.NoError(t, json.Unmarshal(data, &e))
	return e
}

// trtPlacement reads the slot lists of the load-balancer YAML the
// fixture was recorded under ("  layer: [ids]" lines, layers ascending).
func trtPlacement(t *testing.T) [][]Expert {
	t.Helper()
	data, err := os.ReadFile(testdataPath(t, "serving-stacks", "trtllm_load_balancer.yaml"))
	require.NoError(t, err)
	var out [][]Expert
	for _, line := range strings.Split(string(data), "\n") {
		_, list, ok := strings.Cut(line, ": [")
		if !ok || !strings.HasPrefix(line, "  ") {
			continue
		}
		var row []Expert
		for _, f := range strings.Split(strings.TrimSuffix(list, "]"), ", ") {
			e, err := strconv.Atoi(f)
			require.NoError(t, err)
			row = append(row, Expert(e))
		}
		out = append(out, row)
	}
	require.Len(t, out, 8)
	return out
}

// TestTRTLLMRawFiles reads rank{r}_raw.safetensors (expert_statistic.py at
// 7ce477f) as the per-token trace: each rank's rows in iteration order,
// source = rank, step = iteration, adding up to the rank{r} counts.
func TestTRTLLMRawFiles(t *testing.T) {
	sets, want := flameSets(t), readTRTExpected(t)
	src, err := Load(testdataPath(t, "serving-stacks", "trtllm_raw"), LoadOptions{})
	require.NoError(t, err)
	require.NotNil(t, src.Trace, "the raw files are per-token data")
	var order []int
	var source, step []int32
	for r := range 2 {
		for _, tok := range want.Raw.TokenOrder[strconv.Itoa(r)] {
			order = append(order, tok)
			source = append(source, int32(r))
			step = append(step, int32(100+tok/32))
		}
	}
	checkTokens(t, src.Trace, sets, order, source, step)
	s := src.Stats
	assert.Equal(t, recount(sets, span(0, 128)), s.Load)
	assert.Equal(t, 128.0, s.Tokens)
	assert.Equal(t, moeLayers, s.LayerNames)
	assert.Len(t, s.StepLoad, 4, "iterations 100..103: the range's stop is recorded at 7ce477f")
	require.Len(t, s.SourceLoad, 2)
	assert.Equal(t, recount(sets, want.Raw.TokenOrder["0"]), s.SourceLoad[0])
	require.NotEmpty(t, s.Patterns)
	perSource := map[int32]float64{}
	for _, p := range s.Patterns {
		perSource[p.Source] += p.Count
	}
	assert.Equal(t, map[int32]float64{0: 64, 1: 64}, perSource, "each path's source is its rank")
	assert.Empty(t, s.Notes)
	assert.Zero(t, src.Slots)

	// The raw files alone are a trace too.
	dir := t.TempDir()
	for _, name := range []string{"meta_info.json", "rank0_raw.safetensors", "rank1_raw.safetensors"} {
		copyFile(t, testdataPath(t, "serving-stacks", "trtllm_raw", name), filepath.Join(dir, name))
	}
	alone, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, s.Load, alone.Stats.Load)
	assert.Equal(t, s.SourceLoad, alone.Stats.SourceLoad)
}

// TestTRTLLMSkippedFileNote: a .safetensors file that is none of
// TensorRT-LLM's statistics files is skipped with a note naming it.
func TestTRTLLMSkippedFileNote(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"meta_info.json", "rank0.safetensors", "rank1.safetensors"} {
		copyFile(t, testdataPath(t, "serving-stacks", "trtllm_raw", name), filepath.Join(dir, name))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), safetensorsBytes("w", "I32", []int{2}, le32(1, 2)), 0o644))
	src, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	require.Len(t, src.Stats.Notes, 1)
	assert.Contains(t, src.Stats.Notes[0], filepath.Join(dir, "model.safetensors")+" skipped")
	assert.Equal(t, recount(flameSets(t), span(0, 128)), src.Stats.Load)
}

// TestTRTLLMLoadBalancerSlots: under a load_balancer config the dump
// counts the 72 slots; with the placement that was serving the slots fold
// back to the 64 logical experts, token paths included.
func TestTRTLLMLoadBalancerSlots(t *testing.T) {
	sets, want := flameSets(t), readTRTExpected(t)
	dir := testdataPath(t, "serving-stacks", "trtllm_load_balancer")

	raw, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, 72, raw.Stats.Experts, "read as it is, the dump counts slots")
	assert.Equal(t, want.LoadBalancer.SlotLoad, raw.Stats.Load)

	_, err = Load(dir, LoadOptions{Experts: 64})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "meta_info.json says 72 experts, but LoadOptions.Experts is 64: TensorRT-LLM's load balancer records physical slots")

	plan := trtPlacement(t)
	for _, experts := range []int{0, 64} {
		src, err := Load(dir, LoadOptions{SlotExperts: plan, Experts: experts})
		require.NoError(t, err)
		assert.Equal(t, 72, src.Slots)
		s := src.Stats
		assert.Equal(t, 64, s.Experts)
		assert.Equal(t, recount(sets, span(0, 128)), s.Load)
		require.Len(t, s.SourceLoad, 8)
		var order []int
		var source, step []int32
		for r := range 8 {
			o := want.LoadBalancer.TokenOrder[strconv.Itoa(r)]
			assert.Equal(t, recount(sets, o), s.SourceLoad[r], "rank %d", r)
			for _, tok := range o {
				order = append(order, tok)
				source = append(source, int32(r))
				step = append(step, int32(100+tok/64))
			}
		}
		require.NotNil(t, src.Trace)
		checkTokens(t, src.Trace, sets, order, source, step)
	}

	// Read for the statistics only (as the CLI does), the paths fold too.
	st, err := Load(dir, LoadOptions{SlotExperts: plan, StatsOnly: true, PathError: -1})
	require.NoError(t, err)
	assert.Equal(t, recount(sets, span(0, 128)), st.Stats.Load)
	require.NotEmpty(t, st.Stats.Patterns)
	for _, p := range st.Stats.Patterns {
		for _, e := range p.Experts {
			assert.Less(t, int(e), 64)
		}
	}

	// A placement of another shape is refused, naming both.
	short := slices.Clone(plan)
	for l := range short {
		short[l] = short[l][:64]
	}
	_, err = Load(dir, LoadOptions{SlotExperts: short})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "72 ids per layer, but the placement in LoadOptions.SlotExperts has 64 slots")
	_, err = Load(dir, LoadOptions{SlotExperts: plan[:7]})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has 7 layers")

	// A dump of logical ids read with a replicated placement stays logical.
	logical, err := Load(testdataPath(t, "serving-stacks", "trtllm_raw"), LoadOptions{SlotExperts: plan})
	require.NoError(t, err)
	assert.Zero(t, logical.Slots)
	assert.Equal(t, recount(sets, span(0, 128)), logical.Stats.Load)
}

// TestTRTLLMWithoutAttentionDP: every rank wrote the same files (no
// attention DP): each token counts once, with no source rank, and a note
// says why.
func TestTRTLLMWithoutAttentionDP(t *testing.T) {
	sets := flameSets(t)
	src, err := Load(testdataPath(t, "serving-stacks", "trtllm_no_attention_dp"), LoadOptions{})
	require.NoError(t, err)
	s := src.Stats
	assert.Equal(t, 32.0, s.Tokens)
	assert.Equal(t, recount(sets, span(0, 32)), s.Load)
	assert.Nil(t, s.SourceLoad)
	require.NotNil(t, src.Trace)
	assert.Equal(t, 32, src.Trace.Tokens)
	for _, r := range src.Trace.Source {
		assert.Equal(t, int32(-1), r)
	}
	require.Len(t, s.Notes, 1)
	assert.Contains(t, s.Notes[0], "every rank recorded the same routing")
	assert.Contains(t, s.Notes[0], "enable_attention_dp")

	// Ranks that differ are not merged: the raw dump keeps its sources.
	other, err := Load(testdataPath(t, "serving-stacks", "trtllm_raw"), LoadOptions{})
	require.NoError(t, err)
	assert.Len(t, other.Stats.SourceLoad, 2)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, data, 0o644))
}

// TestTRTLLMSlotCoActivation folds [P, P] co-occurrence files of slots:
// two tokens of layer 0, on slots {0, 1} and {3, 2}, where slot 3 is a
// second copy of expert 0 (P = 4 slots for 3 experts).
func TestTRTLLMSlotCoActivation(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	write("meta_info.json", []byte(`{"num_experts": 4, "num_experts_per_token": 2}`))
	write("rank0.safetensors", safetensorsBytes("1_0", "I64", []int{4}, le64s(1, 1, 1, 1)))
	co := make([]int32, 16)
	for _, tok := range [][2]int{{0, 1}, {3, 2}} {
		for _, a := range tok {
			for _, b := range tok {
				co[a*4+b]++
			}
		}
	}
	write("cooccurrence_rank0.safetensors", safetensorsBytes("1_0", "I32", []int{4, 4}, le32(co...)))
	src, err := Load(dir, LoadOptions{SlotExperts: [][]Expert{{0, 1, 2, 0}}})
	require.NoError(t, err)
	assert.Equal(t, 4, src.Slots)
	assert.Equal(t, [][]float64{{2, 1, 1}}, src.Stats.Load)
	assert.Equal(t, [][]float64{{0, 1, 1, 1, 0, 0, 1, 0, 0}}, src.Stats.CoActivation)

	// A slot id past num_slots in a raw file is an error naming it.
	write("rank0_raw.safetensors", safetensorsBytes("1_0", "I32", []int{2, 2}, le32(0, 1, 3, 4)))
	_, err = Load(dir, LoadOptions{SlotExperts: [][]Expert{{0, 1, 2, 0}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1_0[1][1]: slot 4 out of range [0,4) (the load balancer's num_slots)")
}
