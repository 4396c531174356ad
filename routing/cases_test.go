package routing

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// casesDir holds fixtures written by testdata/serving-stacks/cases/gen.py
// (real torch.save where the stack uses it) with their expected content.
const casesDir = "../testdata/serving-stacks/cases"

type casesExpected struct {
	Wrapped struct {
		Passes []int       `json:"passes_in_time_order"`
		Layer0 [][]float64 `json:"step_load_layer0"`
	} `json:"sglang_stat_wrapped.pt"`
	Full struct {
		Passes []int `json:"passes_in_buffer_order"`
	} `json:"sglang_stat_full.pt"`
	PP struct {
		Layers []int `json:"layers"`
		Tokens int   `json:"tokens"`
	} `json:"megatron_pp"`
	Inference struct {
		ModelLayers int   `json:"num_hidden_layers"`
		Layers      []int `json:"layers"`
		Tokens      int   `json:"tokens"`
	} `json:"megatron_inference"`
	Sidecars struct {
		Layers  []int    `json:"layers"`
		Tokens  int      `json:"tokens"`
		Skipped []string `json:"skipped"`
	} `json:"megatron_sidecars"`
}

func readCasesExpected(t *testing.T) casesExpected {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(casesDir, "expected.json"))
	require.NoError(t, err)
	var want casesExpected
	require.NoError(t, json.Unmarshal(data, &want))
	return want
}

// flameFirst returns the ids of FLAME's first n tokens ([n][8][6]), the
// tokens every fixture of casesDir is made of.
func flameFirst(t *testing.T, n int) *Trace {
	t.Helper()
	src, err := Load("../testdata/flame-moe-290m/trace.jsonl", LoadOptions{})
	require.NoError(t, err)
	tr := src.Trace
	require.GreaterOrEqual(t, tr.Tokens, n)
	return tr
}

// TestSGLangStatTimeOrder: a stat dump whose circular buffer started past
// row 0 (the recorder's reset keeps the write index) comes back in time
// order, found from its one run of unfilled rows; in buffer order
// (before) the steps were passes 6, 7, 3, 4, 5. A full buffer has no
// such run: its steps are kept but marked unordered, with a note.
func TestSGLangStatTimeOrder(t *testing.T) {
	want := readCasesExpected(t)
	src, err := Load(filepath.Join(casesDir, "sglang_stat_wrapped.pt"), LoadOptions{})
	require.NoError(t, err)
	s := src.Stats
	assert.False(t, s.StepsUnordered)
	require.Len(t, s.StepLoad, len(want.Wrapped.Passes))
	for i, row := range want.Wrapped.Layer0 {
		assert.Equal(t, row, s.StepLoad[i][0], "step %d is pass %d", i, want.Wrapped.Passes[i])
	}

	src, err = Load(filepath.Join(casesDir, "sglang_stat_full.pt"), LoadOptions{})
	require.NoError(t, err)
	s = src.Stats
	assert.True(t, s.StepsUnordered)
	assert.Len(t, s.StepLoad, len(want.Full.Passes))
	require.NotEmpty(t, s.Notes)
	assert.Contains(t, s.Notes[len(s.Notes)-1], "the passes' time order is unknown")
	assert.Contains(t, s.Notes[len(s.Notes)-1], "all 4 rows are filled (the buffer may have wrapped around)")

	// The flag survives a moetuner stats file and a merge.
	var b strings.Builder
	require.NoError(t, WriteStats(&b, s, StatsMoetuner))
	back, err := parseMoetunerStats([]byte(b.String()), "s.json")
	require.NoError(t, err)
	assert.True(t, back.StepsUnordered)
	ordered, err := Load(filepath.Join(casesDir, "sglang_stat_wrapped.pt"), LoadOptions{})
	require.NoError(t, err)
	require.NoError(t, ordered.Stats.Merge(s))
	assert.True(t, ordered.Stats.StepsUnordered)
}

// TestStatTimeOrder covers statTimeOrder's cases on their own.
func TestStatTimeOrder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filled []bool
		order  []int
		known  bool
	}{
		{"unwrapped", []bool{true, true, false, false}, []int{0, 1}, true},
		{"started past 0", []bool{false, true, true, false}, []int{1, 2}, true},
		{"wrapped", []bool{true, false, false, true}, []int{3, 0}, true},
		{"full", []bool{true, true, true}, []int{0, 1, 2}, false},
		{"two runs", []bool{true, false, true, false}, []int{0, 2}, false},
		{"one row", []bool{false, true, false}, []int{1}, true},
		{"empty", []bool{false, false}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order, known := statTimeOrder(tc.filled)
			assert.Equal(t, tc.order, order)
			assert.Equal(t, tc.known, known)
		})
	}
}

// TestMegatronPipelineStages: four rank files of a 2-stage pipeline (2
// data-parallel ranks per stage) whose records number layers 0-3 within
// each stage. With the stage offsets the pipelines are joined into
// 128 whole-model tokens over decoder layers 0-7 that equal the FLAME
// tokens they were made of; without them (before: silently) the stages'
// layers 0-3 were merged as one layer set with twice the tokens.
func TestMegatronPipelineStages(t *testing.T) {
	want := readCasesExpected(t)
	flame := flameFirst(t, want.PP.Tokens)
	dir := filepath.Join(casesDir, "megatron_pp")
	src, err := Load(dir, LoadOptions{MegatronLayerOffsets: map[int]int{0: 0, 1: 0, 2: 4, 3: 4}})
	require.NoError(t, err)
	tr := src.Trace
	require.NotNil(t, tr)
	assert.Equal(t, want.PP.Layers, tr.LayerNames)
	require.Equal(t, want.PP.Tokens, tr.Tokens)
	// Token blocks of 32 in file order: rank 0 step 0 (FLAME tokens
	// 0-31), rank 0 step 1 (64-95), rank 1 step 0 (32-63), rank 1 step 1
	// (96-127); sources the first-stage ranks.
	firstToken := []int{0, 64, 32, 96}
	LK := tr.Layers * tr.TopK
	for blk, f := range firstToken {
		for i := range 32 {
			got := tr.IDs[(blk*32+i)*LK : (blk*32+i+1)*LK]
			exp := flame.IDs[(f+i)*LK : (f+i+1)*LK]
			require.Equal(t, exp, got, "block %d token %d", blk, i)
		}
		assert.Equal(t, int32(blk/2), tr.Source[blk*32])
	}
	assert.Contains(t, strings.Join(src.Stats.Notes, "\n"), "2 pipeline stages (layer ids 0-3, 4-7) joined into 2 pipelines")

	// One offset for every file reads the four as data-parallel ranks
	// of layers 4-7: the join needs offsets that differ by stage.
	src, err = Load(dir, LoadOptions{MegatronLayerOffsets: map[int]int{-1: 4}})
	require.NoError(t, err)
	assert.Equal(t, []int{4, 5, 6, 7}, src.Stats.LayerNames)

	_, err = Load(dir, LoadOptions{MegatronLayerOffsets: map[int]int{0: 0, 1: 0, 2: 4}})
	assert.ErrorContains(t, err, "rank 3 has no layer offset")
	_, err = Load(dir, LoadOptions{MegatronLayerOffsets: map[int]int{0: 0, 1: 0, 2: 2, 3: 2}})
	assert.ErrorContains(t, err, "decoder layers [2 3 4 5], but ")
	_, err = Load(dir, LoadOptions{MegatronLayerOffsets: map[int]int{0: 0, 1: 4, 2: 4, 3: 4}})
	assert.ErrorContains(t, err, "3 rank files record decoder layers [4 5 6 7] but 1 record [0 1 2 3]: the files are neither data-parallel copies of one layer set nor pipeline stages")
}

// TestMegatronOneBased: record_indices traces number layers 1..8
// (layer_number); with the model's 8 decoder layers known they read as
// decoder layers 0..7 with a note (before: 1..8, every plan one layer
// off). An id past the model is an error.
func TestMegatronOneBased(t *testing.T) {
	want := readCasesExpected(t)
	dir := filepath.Join(casesDir, "megatron_inference")
	src, err := Load(dir, LoadOptions{ModelLayers: want.Inference.ModelLayers})
	require.NoError(t, err)
	assert.Equal(t, want.Inference.Layers, src.Stats.LayerNames)
	assert.Equal(t, float64(want.Inference.Tokens), src.Stats.Tokens)
	assert.Contains(t, strings.Join(src.Stats.Notes, "\n"), "layer ids 1..8 are 1-based (record_indices stamps layer_number; the model has 8 decoder layers): read as decoder layers 0..7")
	flame := flameFirst(t, want.Inference.Tokens)
	LK := 8 * 6
	assert.Equal(t, flame.IDs[:want.Inference.Tokens*LK], src.Trace.IDs)

	// A 0-based trace of the same model is left alone.
	src, err = Load(filepath.Join(casesDir, "megatron_sidecars"), LoadOptions{ModelLayers: 8})
	require.NoError(t, err)
	assert.Equal(t, want.Sidecars.Layers, src.Stats.LayerNames)

	_, err = Load(dir, LoadOptions{ModelLayers: 7})
	assert.ErrorContains(t, err, "layer: 8, but the model has 7 decoder layers")

	// Pipeline stages in inference record global ids (stage 0 layers 1-4,
	// stage 1 layers 5-8): they are joined without offsets.
	src, err = Load(filepath.Join(casesDir, "megatron_pp_inference"), LoadOptions{ModelLayers: 8})
	require.NoError(t, err)
	assert.Equal(t, want.Inference.Layers, src.Stats.LayerNames)
	assert.Equal(t, flame.IDs[:64*LK], src.Trace.IDs)
	assert.Contains(t, strings.Join(src.Stats.Notes, "\n"), "2 pipeline stages (layer ids 1-4, 5-8) joined into 1 pipelines")
}

// TestMegatronSidecars: a directory written with
// --moe-routing-trace-dump-weights and hidden-state/logit capture holds
// router_state_rank0.pt and two .bin files beside the trace; they are
// skipped with a note (before: the .pt made the directory "mix" kinds).
func TestMegatronSidecars(t *testing.T) {
	want := readCasesExpected(t)
	src, err := Load(filepath.Join(casesDir, "megatron_sidecars"), LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatMegatron, src.Format)
	assert.Equal(t, want.Sidecars.Layers, src.Stats.LayerNames)
	assert.Equal(t, float64(want.Sidecars.Tokens), src.Stats.Tokens)
	notes := strings.Join(src.Stats.Notes, "\n")
	assert.Contains(t, notes, "skipped 3 Megatron router-trace sidecar files ("+strings.Join(want.Sidecars.Skipped, ", ")+")")
}

// TestMegatronVirtualPipeline: with virtual pipeline stages one rank's
// chunks both number their layers from 0, so a step repeats layer ids;
// the file cannot say which chunk a record is from, and the reader
// refuses with the cause and what to record instead (before: the same
// "recorded twice" with no cause).
func TestMegatronVirtualPipeline(t *testing.T) {
	dir := filepath.Join(casesDir, "megatron_vpp")
	for _, opts := range []LoadOptions{{}, {MegatronLayerOffsets: map[int]int{0: 0}}} {
		_, err := Load(dir, opts)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "router_trace_rank0.jsonl:3: layer: step 0 layer 0 recorded twice: in training the layer is the index within the model chunk, so virtual-pipeline chunks (--virtual-pipeline-model-parallel-size) reuse it")
	}
}
