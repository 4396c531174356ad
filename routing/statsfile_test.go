package routing

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withSources gives the FLAME trace steps and sources (one unknown).
func withSources(t *testing.T) *Trace {
	tr := loadFLAMEJSONL(t)
	tr.Step = make([]int32, tr.Tokens)
	tr.Source = make([]int32, tr.Tokens)
	for i := range tr.Step {
		tr.Step[i] = int32(i / 256)
		tr.Source[i] = int32(i % 3)
	}
	tr.Source[5] = -1
	tr.ModelLayers = 10
	return tr
}

// TestSourceLoad checks the per-source loads against a direct count: a
// token credited to the wrong source or left out changes a matrix. Merging
// slices adds rank by rank, Scale and Clone cover it, Validate polices it.
func TestSourceLoad(t *testing.T) {
	tr := withSources(t)
	s := tr.Stats(StatsOptions{NoPatterns: true})
	require.Len(t, s.SourceLoad, 3)
	for r := range 3 {
		want := newMatrix(tr.Layers, tr.Experts)
		for tok := range tr.Tokens {
			if tr.Source[tok] != int32(r) {
				continue
			}
			for l := range tr.Layers {
				for j := range tr.TopK {
					want[l][tr.At(tok, l, j)]++
				}
			}
		}
		assert.Equal(t, want, s.SourceLoad[r], "source %d", r)
	}
	// Σ_r SourceLoad + the unknown token's experts = Load.
	sum := newMatrix(tr.Layers, tr.Experts)
	for _, m := range s.SourceLoad {
		addMatrix(sum, m)
	}
	for l := range tr.Layers {
		for j := range tr.TopK {
			sum[l][tr.At(5, l, j)]++
		}
	}
	assert.Equal(t, s.Load, sum)

	merged := &Stats{}
	for _, r := range [][2]int{{0, 2}, {2, 700}, {700, 1024}} {
		require.NoError(t, merged.Merge(tr.Slice(r[0], r[1]).Stats(StatsOptions{NoPatterns: true})))
	}
	assert.Equal(t, s.SourceLoad, merged.SourceLoad, "the first slice has sources 0 and 1 only; merging pads rank 2")

	c := s.Clone()
	c.SourceLoad[0][0][0]++
	assert.NotEqual(t, c.SourceLoad[0][0][0], s.SourceLoad[0][0][0], "Clone copies SourceLoad")
	c = s.Clone()
	c.Scale(0.5)
	assert.Equal(t, s.SourceLoad[2][3][7]/2, c.SourceLoad[2][3][7])

	bad := s.Clone()
	bad.SourceLoad[1][0][0] += s.Load[0][0] + 1
	assert.ErrorContains(t, bad.Validate(), "SourceLoad summed over sources is")
	bad = s.Clone()
	bad.SourceLoad[1] = bad.SourceLoad[1][:2]
	assert.ErrorContains(t, bad.Validate(), "routing: SourceLoad[1] has 2 rows, want 8")

	noSrc := tr.Slice(0, 10).Stats(StatsOptions{})
	noSrc.SourceLoad = nil
	require.NoError(t, merged.Merge(noSrc))
	assert.Nil(t, merged.SourceLoad, "a side without sources drops them")

	huge := handTrace()
	huge.Source = []int32{0, 1 << 30, 2}
	assert.Nil(t, huge.Stats(StatsOptions{}).SourceLoad, "a stray huge rank leaves SourceLoad unknown instead of allocating")
}

func writeStats(t *testing.T, s *Stats, f StatsFormat) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, WriteStats(&buf, s, f))
	return buf.Bytes()
}

// normalized is s as a moetuner.stats file reads it back: layer names
// written out and the source list that of the file read.
func normalized(s *Stats, file string) *Stats {
	c := s.Clone()
	if c.LayerNames == nil {
		c.LayerNames = make([]int, c.Layers)
		for l := range c.LayerNames {
			c.LayerNames[l] = l
		}
	}
	c.Sources = []string{file}
	return c
}

// TestStatsFileRoundTrip writes every part moetuner keeps and reads it
// back unchanged; a field left out of the writer or the reader fails.
func TestStatsFileRoundTrip(t *testing.T) {
	tr := withSources(t)
	sg, err := Load(testdataPath(t, "serving-stacks", "sglang_stat.pt"), LoadOptions{TopK: 6})
	require.NoError(t, err)
	top1 := handTrace().Stats(StatsOptions{Transitions: TransitionTop1})
	scaled := tr.Stats(StatsOptions{})
	scaled.Scale(0.3)
	for name, s := range map[string]*Stats{
		"trace":  tr.Stats(StatsOptions{}),
		"top1":   top1,
		"scaled": scaled,
		"counts": sg.Stats,
	} {
		t.Run(name, func(t *testing.T) {
			b := writeStats(t, s, StatsMoetuner)
			assert.Equal(t, b, writeStats(t, s, StatsMoetuner), "deterministic")
			src, err := Read(bytes.NewReader(b), "s.json", LoadOptions{})
			require.NoError(t, err)
			assert.Equal(t, FormatMoetunerStats, src.Format)
			assert.Equal(t, normalized(s, "s.json"), src.Stats)
		})
	}
}

// TestStatsFilesAddUp: reading two stats files together gives Merge of
// their stats, so statistics from many servers combine.
func TestStatsFilesAddUp(t *testing.T) {
	tr := withSources(t)
	a, b := tr.Slice(0, 400).Stats(StatsOptions{}), tr.Slice(400, 1024).Stats(StatsOptions{})
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	require.NoError(t, os.WriteFile(pa, writeStats(t, a, StatsMoetuner), 0o644))
	require.NoError(t, os.WriteFile(pb, writeStats(t, b, StatsMoetuner), 0o644))
	got, _, err := LoadAll([]string{pa, pb}, LoadOptions{})
	require.NoError(t, err)
	want := normalized(a, pa)
	require.NoError(t, want.Merge(normalized(b, pb)))
	assert.Equal(t, want, got)
	full := tr.Stats(StatsOptions{})
	assert.Equal(t, full.Load, got.Load)
	assert.Equal(t, full.Transitions, got.Transitions)
	assert.Equal(t, full.Patterns, got.Patterns)
	assert.Equal(t, full.SourceLoad, got.SourceLoad)
}

// TestLogicalCountOut checks the SGLang/EPLB form: one row per decoder
// layer, dense rows zero, and that reading it back gives the same loads.
func TestLogicalCountOut(t *testing.T) {
	s := &Stats{Layers: 2, Experts: 3, TopK: 1, Tokens: 4, Load: [][]float64{{1, 2, 1}, {0, 4, 0.5}}, LayerNames: []int{1, 3}, ModelLayers: 5}
	assert.Equal(t, "{\"logical_count\": [\n  [0,0,0],\n  [1,2,1],\n  [0,0,0],\n  [0,4,0.5],\n  [0,0,0]\n]}\n", string(writeStats(t, s, StatsLogicalCount)))
	s.ModelLayers = 0
	assert.Equal(t, "{\"logical_count\": [\n  [0,0,0],\n  [1,2,1],\n  [0,0,0],\n  [0,4,0.5]\n]}\n", string(writeStats(t, s, StatsLogicalCount)), "without ModelLayers: rows up to the last MoE layer")
	s.LayerNames = nil
	assert.Equal(t, "{\"logical_count\": [\n  [1,2,1],\n  [0,4,0.5]\n]}\n", string(writeStats(t, s, StatsLogicalCount)), "without names: the MoE rows only")

	sg, err := Load(testdataPath(t, "serving-stacks", "sglang_stat.pt"), LoadOptions{})
	require.NoError(t, err)
	b := writeStats(t, sg.Stats, StatsLogicalCount)
	back, err := Read(bytes.NewReader(b), "lc.json", LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatLogicalCount, back.Format)
	assert.Equal(t, sg.Stats.Load, back.Stats.Load)
	assert.Equal(t, sg.Stats.LayerNames, back.Stats.LayerNames)
	assert.Equal(t, sg.Stats.ModelLayers, back.Stats.ModelLayers)
	assert.Equal(t, 12, strings.Count(string(b), "\n"), "the opening line, one line per decoder layer, the closing line")

	assert.ErrorContains(t, WriteStats(&bytes.Buffer{}, sg.Stats, "csv"), `routing: unknown stats format "csv": want moetuner or logical-count`)
	bad := sg.Stats.Clone()
	bad.Load[0][0] = -1
	assert.ErrorContains(t, WriteStats(&bytes.Buffer{}, bad, StatsMoetuner), "routing: Load[0][0] = -1")
	dup := s.Clone()
	dup.LayerNames = []int{2, 2}
	assert.ErrorContains(t, dup.Validate(), "routing: LayerNames[1] = 2 repeats LayerNames[0]")
	assert.ErrorContains(t, WriteStats(&bytes.Buffer{}, dup, StatsLogicalCount), "repeats")
}

func TestFormatsListed(t *testing.T) {
	for _, f := range Formats {
		assert.NotEmpty(t, string(f))
	}
	assert.True(t, slices.Contains(Formats, FormatSGLangPT))
	assert.Len(t, Formats, 12)
}

// TestStatsFileLimits: patterns too large for a file are thinned to a
// weighted sample that fits (and read back as one), and stats too large to
// read back are refused.
func TestStatsFileLimits(t *testing.T) {
	s := handTrace().Stats(StatsOptions{})
	require.NotNil(t, s.Patterns)
	ids := len(s.Patterns) * s.Layers * s.TopK
	capped := func(maxPatternIDs int) []byte {
		var buf bytes.Buffer
		require.NoError(t, writeStatsCapped(&buf, s, StatsMoetuner, maxPatternIDs))
		return buf.Bytes()
	}
	back, err := Read(bytes.NewReader(capped(ids)), "s.json", LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, s.Patterns, back.Stats.Patterns, "at the limit the patterns are kept")
	back, err = Read(bytes.NewReader(capped(ids-1)), "s.json", LoadOptions{})
	require.NoError(t, err)
	// Past it, one path of ids-1 fits: it carries every token's weight.
	require.Len(t, back.Stats.Patterns, 1, "past it they are thinned")
	assert.Equal(t, s.Tokens, back.Stats.Patterns[0].Count)
	assert.Equal(t, int64(1), back.Stats.PathSample.Kept)
	assert.Equal(t, int64(3), back.Stats.PathSample.Tokens)
	assert.Greater(t, back.Stats.PathSample.RelStdErr, 0.0)
	require.Len(t, back.Stats.Notes, 1)
	assert.Contains(t, back.Stats.Notes[0], "per-token paths sampled: 1 of 3 tokens kept")
	assert.Equal(t, s.Load, back.Stats.Load)
	assert.Nil(t, s.Notes, "the stats written are left as they were")

	huge := &Stats{Layers: 1, Experts: 1 << 14, Load: [][]float64{make([]float64, 1<<14)}}
	huge.StepLoad = make([][][]float64, 1<<12+1)
	for i := range huge.StepLoad {
		huge.StepLoad[i] = huge.Load
	}
	assert.ErrorContains(t, WriteStats(&bytes.Buffer{}, huge, StatsMoetuner), "counts are too many for a moetuner.stats file")
	assert.NoError(t, WriteStats(&bytes.Buffer{}, huge, StatsLogicalCount), "logical_count writes Load only")
}
