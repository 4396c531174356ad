package routing

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flameSets returns FLAME's tokens as sorted expert sets [token][layer].
func flameSets(t testing.TB) [][][]int16 {
	t.Helper()
	src, err := Load(testdataPath(t, "flame-moe-290m", "trace.jsonl"), LoadOptions{NoPatterns: true})
	require.NoError(t, err)
	return traceSets(src.Trace)
}

func traceSets(tr *Trace) [][][]int16 {
	out := make([][][]int16, tr.Tokens)
	for tok := range tr.Tokens {
		out[tok] = make([][]int16, tr.Layers)
		for l := range tr.Layers {
			set := slices.Clone(tr.IDs[(tok*tr.Layers+l)*tr.TopK : (tok*tr.Layers+l+1)*tr.TopK])
			slices.Sort(set)
			out[tok][l] = set
		}
	}
	return out
}

// recount counts the experts of the given FLAME tokens per layer.
func recount(sets [][][]int16, tokens []int) [][]float64 {
	m := newMatrix(len(sets[0]), 64)
	for _, tok := range tokens {
		for l, set := range sets[tok] {
			for _, e := range set {
				m[l][e]++
			}
		}
	}
	return m
}

func span(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// vendored layout (see testdata/serving-stacks/make.py): 128 FLAME tokens
// in passes of 32, pass i on rank i%2; MoE layers 2..9 of 10.
var (
	moeLayers  = []int{2, 3, 4, 5, 6, 7, 8, 9}
	rank0Order = append(span(0, 32), span(64, 96)...)
	rank1Order = append(span(32, 64), span(96, 128)...)
)

// copyInto copies testdata files into a fresh directory, which Load then
// reads as one dump.
func copyInto(t *testing.T, elem [][]string) string {
	dir := t.TempDir()
	for _, e := range elem {
		b, err := os.ReadFile(testdataPath(t, e...))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, e[len(e)-1]), b, 0o644))
	}
	return dir
}

// checkTokens asserts that tr holds exactly FLAME's tokens order, layer by
// layer, with the given sources and steps.
func checkTokens(t *testing.T, tr *Trace, sets [][][]int16, order []int, source, step []int32) {
	t.Helper()
	require.Equal(t, len(order), tr.Tokens)
	got := traceSets(tr)
	for i, tok := range order {
		require.Equal(t, sets[tok], got[i], "token %d (FLAME token %d)", i, tok)
	}
	assert.Equal(t, source, tr.Source)
	assert.Equal(t, step, tr.Step)
}

// passOf returns the sources and steps of tokens in the vendored order
// rank 0 then rank 1.
func vendoredSourcesSteps(order []int) (src, step []int32) {
	for _, tok := range order {
		src = append(src, int32(tok/32%2))
		step = append(step, int32(tok/32))
	}
	return src, step
}

// TestVendoredSGLangPerToken reads the two per-rank per_token dumps as one
// trace: mapping the physical slots back through the dump's map must give
// exactly FLAME's expert sets (a reader that skipped the map, or read the
// -1 padding or the dense layers as experts, fails), each token's source is
// its record's rank and its step the forward pass.
func TestVendoredSGLangPerToken(t *testing.T) {
	sets := flameSets(t)
	dir := copyInto(t, [][]string{{"serving-stacks", "sglang_per_token_0.pt"}, {"serving-stacks", "sglang_per_token_1.pt"}})
	src, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatSGLangPT, src.Format)
	tr := src.Trace
	require.NotNil(t, tr)
	order := append(slices.Clone(rank0Order), rank1Order...)
	s, st := vendoredSourcesSteps(order)
	checkTokens(t, tr, sets, order, s, st)
	assert.Equal(t, moeLayers, tr.LayerNames)
	assert.Equal(t, 10, tr.ModelLayers)
	assert.Equal(t, 64, tr.Experts)
	assert.Equal(t, 6, tr.TopK)

	stats := src.Stats
	assert.Equal(t, recount(sets, span(0, 128)), stats.Load)
	require.Len(t, stats.StepLoad, 4)
	for p := range 4 {
		assert.Equal(t, recount(sets, span(32*p, 32*p+32)), stats.StepLoad[p], "pass %d", p)
	}
	require.Len(t, stats.SourceLoad, 2)
	assert.Equal(t, recount(sets, rank0Order), stats.SourceLoad[0])
	assert.Equal(t, recount(sets, rank1Order), stats.SourceLoad[1])
}

// TestVendoredSGLangCounts reads the stat and per_pass dumps: stat rows are
// steps with the unfilled zero rows of the buffer dropped; per_pass physical
// counts map to logical ones and per-rank files give per-source loads.
func TestVendoredSGLangCounts(t *testing.T) {
	sets := flameSets(t)
	want := recount(sets, span(0, 128))
	stat, err := Load(testdataPath(t, "serving-stacks", "sglang_stat.pt"), LoadOptions{})
	require.NoError(t, err)
	s := stat.Stats
	assert.Equal(t, want, s.Load)
	assert.Equal(t, moeLayers, s.LayerNames)
	assert.Equal(t, 10, s.ModelLayers)
	require.Len(t, s.StepLoad, 4, "12 unfilled buffer rows are not steps")
	for p := range 4 {
		assert.Equal(t, recount(sets, span(32*p, 32*p+32)), s.StepLoad[p])
	}
	assert.Nil(t, s.SourceLoad)
	assert.Zero(t, s.TopK)

	withK, err := Load(testdataPath(t, "serving-stacks", "sglang_stat.pt"), LoadOptions{TopK: 6})
	require.NoError(t, err)
	assert.Equal(t, 128.0, withK.Stats.Tokens)

	dir := copyInto(t, [][]string{{"serving-stacks", "sglang_per_pass_0.pt"}, {"serving-stacks", "sglang_per_pass_1.pt"}})
	pp, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	s = pp.Stats
	assert.Equal(t, want, s.Load)
	assert.Equal(t, moeLayers, s.LayerNames)
	require.Len(t, s.SourceLoad, 2)
	assert.Equal(t, recount(sets, rank0Order), s.SourceLoad[0])
	assert.Equal(t, recount(sets, rank1Order), s.SourceLoad[1])
	require.Len(t, s.StepLoad, 4)
	assert.Equal(t, recount(sets, span(96, 128)), s.StepLoad[3])
	keep, err := Load(testdataPath(t, "serving-stacks", "sglang_stat.pt"), LoadOptions{KeepZeroLayers: true})
	require.NoError(t, err)
	assert.Equal(t, 10, keep.Stats.Layers)
	assert.Nil(t, keep.Stats.LayerNames)
}

// TestVendoredTRTLLM reads the expert_statistic dump: counts summed over
// ranks and iterations, iterations as steps, ranks as sources, and the
// token files, whose rows align, as the per-token trace.
func TestVendoredTRTLLM(t *testing.T) {
	sets := flameSets(t)
	src, err := Load(testdataPath(t, "serving-stacks", "trtllm_expert_statistic"), LoadOptions{})
	require.NoError(t, err)
	s := src.Stats
	assert.Equal(t, FormatTRTLLM, src.Format)
	assert.Equal(t, recount(sets, span(0, 128)), s.Load)
	assert.Equal(t, 6, s.TopK)
	assert.Equal(t, 128.0, s.Tokens)
	assert.Equal(t, moeLayers, s.LayerNames)
	require.Len(t, s.StepLoad, 4)
	assert.Equal(t, recount(sets, span(32, 64)), s.StepLoad[1])
	var order0, order1 []int
	for it := range 4 {
		order0 = append(order0, span(32*it, 32*it+16)...)
		order1 = append(order1, span(32*it+16, 32*it+32)...)
	}
	require.Len(t, s.SourceLoad, 2)
	assert.Equal(t, recount(sets, order0), s.SourceLoad[0])
	assert.Equal(t, recount(sets, order1), s.SourceLoad[1])
	require.NotNil(t, src.Trace)
	var source, step []int32
	for r, o := range [][]int{order0, order1} {
		for _, tok := range o {
			source = append(source, int32(r))
			step = append(step, int32(100+tok/32))
		}
	}
	checkTokens(t, src.Trace, sets, append(slices.Clone(order0), order1...), source, step)
	assert.NotNil(t, s.Transitions)

	co, err := Load(testdataPath(t, "serving-stacks", "trtllm_cooccurrence"), LoadOptions{})
	require.NoError(t, err)
	want := newMatrix(2, 64*64)
	for tok := range 32 {
		for l := range 2 {
			for _, a := range sets[tok][l] {
				for _, b := range sets[tok][l] {
					if a != b {
						want[l][int(a)*64+int(b)]++
					}
				}
			}
		}
	}
	assert.Equal(t, want, co.Stats.CoActivation)
	assert.Equal(t, []int{2, 3}, co.Stats.LayerNames)
}

// TestVendoredMegatron reads both rank files as one trace (source = file
// rank, step = record step) and skips the MTP record.
func TestVendoredMegatron(t *testing.T) {
	sets := flameSets(t)
	src, err := Load(testdataPath(t, "serving-stacks", "megatron_router_trace"), LoadOptions{})
	require.NoError(t, err)
	order := append(slices.Clone(rank0Order), rank1Order...)
	s, st := vendoredSourcesSteps(order)
	checkTokens(t, src.Trace, sets, order, s, st)
	assert.Equal(t, moeLayers, src.Trace.LayerNames)
	assert.Equal(t, recount(sets, rank1Order), src.Stats.SourceLoad[1])
}

func TestVendoredVLLM(t *testing.T) {
	sets := flameSets(t)
	src, err := Load(testdataPath(t, "serving-stacks", "vllm_eplb_load_stats.jsonl"), LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatVLLMLoadStats, src.Format)
	assert.Equal(t, recount(sets, span(0, 128)), src.Stats.Load)
	require.Len(t, src.Stats.StepLoad, 4)
	assert.Equal(t, recount(sets, span(64, 96)), src.Stats.StepLoad[2])
	assert.Nil(t, src.Stats.LayerNames, "vLLM numbers MoE layers, not decoder layers")
}

func TestVendoredRoutedExperts(t *testing.T) {
	sets := flameSets(t)
	path := testdataPath(t, "serving-stacks", "sglang_routed_experts.json")
	_, err := Load(path, LoadOptions{})
	require.ErrorContains(t, err, "routed_experts does not say its top-k: set LoadOptions.TopK to the model's num_experts_per_tok")
	src, err := Load(path, LoadOptions{TopK: 6})
	require.NoError(t, err)
	assert.Equal(t, FormatSGLangRoutedExperts, src.Format)
	checkTokens(t, src.Trace, sets, span(0, 64), nil, nil)
	assert.Equal(t, moeLayers, src.Trace.LayerNames)
	assert.Equal(t, 10, src.Trace.ModelLayers)
	same, err := Load(path, LoadOptions{TopK: 6, ModelLayers: 10})
	require.NoError(t, err)
	assert.Equal(t, src.Trace, same.Trace)
}

// TestNPYSourceSidecar checks that NAME.source.npy gives each token's source.
func TestNPYSourceSidecar(t *testing.T) {
	dir := t.TempDir()
	tr := handTrace()
	f, err := os.Create(filepath.Join(dir, "t.npy"))
	require.NoError(t, err)
	require.NoError(t, WriteNPY(f, tr))
	require.NoError(t, f.Close())
	src, err := Load(filepath.Join(dir, "t.npy"), LoadOptions{})
	require.NoError(t, err)
	assert.Nil(t, src.Trace.Source)

	sources := make([]int64, tr.Tokens)
	for i := range sources {
		sources[i] = int64(i % 3)
	}
	sources[1] = -1
	require.NoError(t, os.WriteFile(filepath.Join(dir, "t.source.npy"), npyBytes("<i2", []int{tr.Tokens}, sources), 0o644))
	src, err = Load(filepath.Join(dir, "t.npy"), LoadOptions{})
	require.NoError(t, err)
	want := make([]int32, tr.Tokens)
	for i, s := range sources {
		want[i] = int32(s)
	}
	assert.Equal(t, want, src.Trace.Source)
	require.NotNil(t, src.Stats.SourceLoad)
	// A directory with the pair reads the sidecar too, not as a trace.
	dsrc, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, want, dsrc.Trace.Source)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "t.source.npy"), npyBytes("<i2", []int{2}, []int64{0, 1}), 0o644))
	_, err = Load(filepath.Join(dir, "t.npy"), LoadOptions{})
	assert.ErrorContains(t, err, "t.source.npy: shape: shape [2], want [")
}

// sharedServing returns ../shared/fixtures/serving-stacks or skips.
func sharedServing(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "..", "shared", "fixtures", "serving-stacks")
	if _, err := os.Stat(filepath.Join(dir, "EXPECTED.json")); err != nil {
		t.Skipf("shared serving-stack fixtures not present at %s", dir)
	}
	return dir
}

type expectedFile struct {
	Load        [][]float64 `json:"logical_load_moe_layers"`
	Tokens      int         `json:"tokens"`
	MoELayers   []int       `json:"moe_layers"`
	ModelLayers int         `json:"num_hidden_layers"`
	Experts     int         `json:"experts"`
	TopK        int         `json:"top_k"`
	Passes      int         `json:"passes"`
}

// byStep orders a trace's tokens by step (stable), which for the shared
// fixtures is FLAME's token order.
func byStep(tr *Trace) []int {
	idx := span(0, tr.Tokens)
	slices.SortStableFunc(idx, func(a, b int) int { return int(tr.Step[a] - tr.Step[b]) })
	return idx
}

// TestSharedServingFixtures checks every shared dump against EXPECTED.json
// and against the FLAME trace it was made from.
func TestSharedServingFixtures(t *testing.T) {
	dir := sharedServing(t)
	b, err := os.ReadFile(filepath.Join(dir, "EXPECTED.json"))
	require.NoError(t, err)
	var ex expectedFile
	require.NoError(t, json.Unmarshal(b, &ex))
	sets := flameSets(t)
	require.Len(t, sets, ex.Tokens)
	checkCounts := func(t *testing.T, s *Stats) {
		assert.Equal(t, ex.Load, s.Load)
		assert.Equal(t, ex.MoELayers, s.LayerNames)
		assert.Equal(t, ex.Experts, s.Experts)
	}
	t.Run("stat", func(t *testing.T) {
		src, err := Load(filepath.Join(dir, "sglang_stat.pt"), LoadOptions{})
		require.NoError(t, err)
		checkCounts(t, src.Stats)
		assert.Equal(t, ex.ModelLayers, src.Stats.ModelLayers)
		require.Len(t, src.Stats.StepLoad, ex.Passes)
		sum := newMatrix(len(ex.MoELayers), ex.Experts)
		for _, m := range src.Stats.StepLoad {
			addMatrix(sum, m)
		}
		assert.Equal(t, ex.Load, sum, "the passes add up to the load")
	})
	t.Run("per_pass", func(t *testing.T) {
		src, err := Load(filepath.Join(dir, "sglang_per_pass_0.pt"), LoadOptions{})
		require.NoError(t, err)
		checkCounts(t, src.Stats)
		assert.Len(t, src.Stats.StepLoad, ex.Passes)
	})
	t.Run("per_token", func(t *testing.T) {
		pt := copyShared(t, dir, "sglang_per_token_0.pt", "sglang_per_token_1.pt")
		src, err := Load(pt, LoadOptions{})
		require.NoError(t, err)
		checkCounts(t, src.Stats)
		tr := src.Trace
		assert.Equal(t, ex.TopK, tr.TopK)
		assert.Equal(t, ex.ModelLayers, tr.ModelLayers)
		got := traceSets(tr)
		for i, tok := range byStep(tr) {
			require.Equal(t, sets[i], got[tok], "FLAME token %d", i)
			assert.Equal(t, tr.Step[tok]%2, tr.Source[tok], "passes alternate between ranks 0 and 1")
		}
	})
	t.Run("trtllm", func(t *testing.T) {
		src, err := Load(filepath.Join(dir, "trtllm_expert_statistic"), LoadOptions{})
		require.NoError(t, err)
		checkCounts(t, src.Stats)
		assert.Equal(t, float64(ex.Tokens), src.Stats.Tokens)
		assert.Equal(t, recount(sets, span(0, ex.Tokens)), src.Stats.Load, "a recount of the FLAME tokens")
		require.Len(t, src.Stats.SourceLoad, 8)
		require.Len(t, src.Stats.StepLoad, 8)
	})
	t.Run("megatron", func(t *testing.T) {
		src, err := Load(filepath.Join(dir, "megatron_router_trace"), LoadOptions{})
		require.NoError(t, err)
		checkCounts(t, src.Stats)
		assert.Equal(t, recount(sets, span(0, ex.Tokens)), src.Stats.Load, "a recount of the FLAME tokens")
		got := traceSets(src.Trace)
		for i, tok := range byStep(src.Trace) {
			require.Equal(t, sets[i], got[tok], "FLAME token %d", i)
		}
	})
	t.Run("init_expert_location", func(t *testing.T) {
		_, err := Load(filepath.Join(dir, "sglang_init_expert_location.pt"), LoadOptions{})
		assert.ErrorContains(t, err, "physical_to_logical_map: this is a placement file (--init-expert-location), not a routing trace")
	})
}

func copyShared(t *testing.T, dir string, names ...string) string {
	out := t.TempDir()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(out, n), b, 0o644))
	}
	return out
}
