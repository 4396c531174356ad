package routing

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// handTrace is the small trace whose stats are worked out by hand below.
//
//	token  source step  layer 0  layer 1
//	0      0      5     [0 1]    [2 3]
//	1      0      7     [1 0]    [3 2]
//	2      -1     5     [2 0]    [1 2]
func handTrace() *Trace {
	return &Trace{
		Tokens: 3, Layers: 2, TopK: 2, Experts: 4,
		IDs:        []int16{0, 1, 2, 3, 1, 0, 3, 2, 2, 0, 1, 2},
		Source:     []int32{0, 0, -1},
		Step:       []int32{5, 7, 5},
		LayerNames: []int{10, 11},
	}
}

// sq builds a row-major 4×4 matrix from (e1, e2, value) triples.
func sq(entries ...[3]float64) []float64 {
	m := make([]float64, 16)
	for _, e := range entries {
		m[int(e[0])*4+int(e[1])] = e[2]
	}
	return m
}

func TestTraceStatsHandComputed(t *testing.T) {
	tr := handTrace()
	require.NoError(t, tr.Validate())
	wantLoad := [][]float64{{3, 2, 1, 0}, {0, 1, 3, 2}}
	wantCo := [][]float64{
		sq([3]float64{0, 1, 2}, [3]float64{1, 0, 2}, [3]float64{0, 2, 1}, [3]float64{2, 0, 1}),
		sq([3]float64{2, 3, 2}, [3]float64{3, 2, 2}, [3]float64{1, 2, 1}, [3]float64{2, 1, 1}),
	}
	wantSteps := [][][]float64{
		{{2, 1, 1, 0}, {0, 1, 2, 1}},
		{{1, 1, 0, 0}, {0, 0, 1, 1}},
	}
	wantPatterns := []Pattern{
		{Source: -1, Experts: []int16{0, 2, 1, 2}, Count: 1},
		{Source: 0, Experts: []int16{0, 1, 2, 3}, Count: 2},
	}
	tests := []struct {
		name  string
		mode  TransitionMode
		trans []float64
	}{
		{"all-pairs", TransitionAllPairs, sq(
			[3]float64{0, 2, 3}, [3]float64{0, 3, 2}, [3]float64{1, 2, 2}, [3]float64{1, 3, 2},
			[3]float64{2, 1, 1}, [3]float64{2, 2, 1}, [3]float64{0, 1, 1})},
		{"top1", TransitionTop1, sq([3]float64{0, 2, 1}, [3]float64{1, 3, 1}, [3]float64{2, 1, 1})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tr.Stats(StatsOptions{Transitions: tc.mode})
			require.NoError(t, s.Validate())
			assert.Equal(t, 3.0, s.Tokens)
			assert.Equal(t, 2, s.Layers)
			assert.Equal(t, 4, s.Experts)
			assert.Equal(t, 2, s.TopK)
			assert.Equal(t, tc.mode, s.TransitionMode)
			assert.Equal(t, wantLoad, s.Load)
			assert.Equal(t, [][]float64{tc.trans}, s.Transitions)
			assert.Equal(t, wantCo, s.CoActivation)
			assert.Equal(t, wantSteps, s.StepLoad)
			assert.Equal(t, wantPatterns, s.Patterns)
			assert.Equal(t, []int{10, 11}, s.LayerNames)
			assert.Equal(t, tc.trans[0*4+2], s.Transition(0, 0, 2))
			assert.Equal(t, tc.trans[2*4+1], s.Transition(0, 2, 1))
			assert.Equal(t, 6.0, s.LayerTotal(1))
		})
	}
	t.Run("no-patterns", func(t *testing.T) {
		s := tr.Stats(StatsOptions{NoPatterns: true})
		assert.Nil(t, s.Patterns)
		assert.Equal(t, wantLoad, s.Load)
	})
	t.Run("no-steps-no-source", func(t *testing.T) {
		tr := handTrace()
		tr.Step, tr.Source = nil, nil
		s := tr.Stats(StatsOptions{})
		assert.Nil(t, s.StepLoad)
		assert.Equal(t, []Pattern{
			{Source: -1, Experts: []int16{0, 1, 2, 3}, Count: 2},
			{Source: -1, Experts: []int16{0, 2, 1, 2}, Count: 1},
		}, s.Patterns)
	})
}

func TestTraceValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Trace)
		want   string
	}{
		{"ok", func(*Trace) {}, ""},
		{"id out of range", func(tr *Trace) { tr.IDs[3] = 4 }, "expert 4 out of range"},
		{"negative id", func(tr *Trace) { tr.IDs[0] = -1 }, "out of range"},
		{"duplicate", func(tr *Trace) { tr.IDs[1] = 0 }, "appears twice"},
		{"short ids", func(tr *Trace) { tr.IDs = tr.IDs[:5] }, "len(IDs)"},
		{"weights length", func(tr *Trace) { tr.Weights = []float32{1} }, "len(Weights)"},
		{"source length", func(tr *Trace) { tr.Source = []int32{1} }, "len(Source)"},
		{"source below -1", func(tr *Trace) { tr.Source[0] = -2 }, "source -2"},
		{"step length", func(tr *Trace) { tr.Step = []int32{1} }, "len(Step)"},
		{"layer names", func(tr *Trace) { tr.LayerNames = []int{1} }, "len(LayerNames)"},
		{"top-k above experts", func(tr *Trace) { tr.Experts = 1 }, "top-k 2 exceeds 1 experts"},
		{"zero layers", func(tr *Trace) { tr.Layers = 0 }, "empty trace shape"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := handTrace()
			tc.modify(tr)
			err := tr.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "routing: ")
		})
	}
}

func TestAtAndSlice(t *testing.T) {
	tr := handTrace()
	tr.Weights = []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	assert.Equal(t, Expert(3), tr.At(1, 1, 0))
	assert.Equal(t, Expert(1), tr.At(2, 1, 0))
	assert.Panics(t, func() { tr.At(3, 0, 0) })

	s := tr.Slice(1, 3)
	require.NoError(t, s.Validate())
	assert.Equal(t, 2, s.Tokens)
	assert.Equal(t, []int16{1, 0, 3, 2, 2, 0, 1, 2}, s.IDs)
	assert.Equal(t, []float32{5, 6, 7, 8, 9, 10, 11, 12}, s.Weights)
	assert.Equal(t, []int32{0, -1}, s.Source)
	assert.Equal(t, []int32{7, 5}, s.Step)
	s.IDs[0] = 3
	assert.Equal(t, int16(1), tr.IDs[4], "Slice must copy")

	empty := tr.Slice(2, 1)
	assert.Equal(t, 0, empty.Tokens)
	require.NoError(t, empty.Validate())
	assert.Equal(t, 3, tr.Slice(-5, 99).Tokens)
}

func loadFLAMEJSONL(t testing.TB) *Trace {
	t.Helper()
	src, err := Load(testdataPath(t, "flame-moe-290m", "trace.jsonl"), LoadOptions{})
	require.NoError(t, err)
	require.NotNil(t, src.Trace)
	return src.Trace
}

func TestMergeEqualsConcatenatedTrace(t *testing.T) {
	tr := loadFLAMEJSONL(t)
	tr.Step = make([]int32, tr.Tokens)
	tr.Source = make([]int32, tr.Tokens)
	for i := range tr.Step {
		tr.Step[i] = int32(i / 256)
		tr.Source[i] = int32(i % 3)
	}
	for _, mode := range []TransitionMode{TransitionAllPairs, TransitionTop1} {
		t.Run(mode.String(), func(t *testing.T) {
			opts := StatsOptions{Transitions: mode}
			full := tr.Stats(opts)
			merged := &Stats{}
			for _, r := range [][2]int{{0, 300}, {300, 512}, {512, 1024}} {
				require.NoError(t, merged.Merge(tr.Slice(r[0], r[1]).Stats(opts)))
			}
			require.NoError(t, merged.Validate())
			assert.Equal(t, full.Load, merged.Load)
			assert.Equal(t, full.Transitions, merged.Transitions)
			assert.Equal(t, full.CoActivation, merged.CoActivation)
			assert.Equal(t, full.Patterns, merged.Patterns)
			assert.Equal(t, full.Tokens, merged.Tokens)
			// Steps 0..3 split at 300 give step 1 in two slices, so only
			// the sum over steps is comparable; 512 is a step boundary.
			require.Len(t, merged.StepLoad, 5)
			first := tr.Slice(0, 512).Stats(opts)
			second := tr.Slice(512, 1024).Stats(opts)
			require.NoError(t, first.Merge(second))
			assert.Equal(t, full.StepLoad, first.StepLoad)
		})
	}
}

func TestMergeRules(t *testing.T) {
	base := func() *Stats { return handTrace().Stats(StatsOptions{}) }
	tests := []struct {
		name   string
		modify func(*Stats)
		want   string
	}{
		{"layers", func(s *Stats) { s.Layers = 3 }, "2 layers vs 3 layers"},
		{"experts", func(s *Stats) { s.Experts = 5 }, "4 experts vs 5 experts"},
		{"top-k", func(s *Stats) { s.TopK = 1 }, "top-k 2 vs top-k 1"},
		{"layer names", func(s *Stats) { s.LayerNames = []int{1, 2} }, "layer names"},
		{"mode", func(s *Stats) { s.TransitionMode = TransitionTop1 }, "transition mode"},
		{"load rows", func(s *Stats) { s.Load = s.Load[:1] }, "Load has 2 rows vs 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, o := base(), base()
			tc.modify(o)
			err := s.Merge(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, base(), s, "a failed merge leaves s unchanged")
		})
	}
	t.Run("missing parts drop", func(t *testing.T) {
		s, o := base(), base()
		o.Transitions, o.CoActivation, o.Patterns, o.StepLoad = nil, nil, nil, nil
		require.NoError(t, s.Merge(o))
		assert.Nil(t, s.Transitions)
		assert.Nil(t, s.CoActivation)
		assert.Nil(t, s.Patterns)
		assert.Nil(t, s.StepLoad)
		assert.Equal(t, [][]float64{{6, 4, 2, 0}, {0, 2, 6, 4}}, s.Load)
	})
	t.Run("unknown top-k adopts", func(t *testing.T) {
		s := StatsFromLoad([][]float64{{1, 2, 3, 4}, {0, 1, 2, 3}}, 0)
		s.LayerNames = []int{10, 11}
		require.NoError(t, s.Merge(base()))
		assert.Equal(t, 2, s.TopK)
		assert.Equal(t, [][]float64{{4, 4, 4, 4}, {0, 2, 5, 5}}, s.Load)
	})
	t.Run("nil", func(t *testing.T) {
		assert.Error(t, base().Merge(nil))
	})
}

func TestCloneScaleStatsFromLoad(t *testing.T) {
	s := handTrace().Stats(StatsOptions{})
	c := s.Clone()
	assert.Equal(t, s, c)
	c.Scale(0.5)
	assert.Equal(t, 1.5, c.Tokens)
	assert.Equal(t, []float64{1.5, 1, 0.5, 0}, c.Load[0])
	assert.Equal(t, 1.0, c.Patterns[1].Count)
	assert.Equal(t, 0.5, c.StepLoad[1][0][0])
	assert.Equal(t, 1.0, c.CoActivation[0][1])
	assert.Equal(t, []float64{3, 2, 1, 0}, s.Load[0], "Clone must deep-copy")
	assert.Equal(t, 2.0, s.Patterns[1].Count)
	assert.Nil(t, (*Stats)(nil).Clone())

	f := StatsFromLoad([][]float64{{2, 4}, {3, 3}}, 2)
	require.NoError(t, f.Validate())
	assert.Equal(t, 3.0, f.Tokens)
	assert.Equal(t, 2, f.Experts)
	assert.Nil(t, f.Transitions)
	assert.Equal(t, 0.0, f.Transition(0, 0, 1))
	ragged := StatsFromLoad([][]float64{{2, 4}, {3}}, 2)
	assert.Error(t, ragged.Validate())
}

func TestStatsValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Stats)
		want   string
	}{
		{"ok", func(*Stats) {}, ""},
		{"negative load", func(s *Stats) { s.Load[0][1] = -1 }, "Load[0][1]"},
		{"asymmetric", func(s *Stats) { s.CoActivation[0][1] = 7 }, "not symmetric"},
		{"diagonal", func(s *Stats) { s.CoActivation[1][5] = 1 }, "diagonal"},
		{"transition rows", func(s *Stats) { s.Transitions = append(s.Transitions, nil) }, "Transitions has 2 rows"},
		{"step shape", func(s *Stats) { s.StepLoad[0] = s.StepLoad[0][:1] }, "StepLoad[0]"},
		{"pattern order", func(s *Stats) { s.Patterns[0], s.Patterns[1] = s.Patterns[1], s.Patterns[0] }, "key order"},
		{"pattern id", func(s *Stats) { s.Patterns[0].Experts[0] = 9 }, "out of range"},
		{"layer names", func(s *Stats) { s.LayerNames = []int{1} }, "LayerNames"},
		{"no layers", func(s *Stats) { s.Layers = 0 }, "both must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := handTrace().Stats(StatsOptions{})
			tc.modify(s)
			err := s.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestSummary(t *testing.T) {
	s := handTrace().Stats(StatsOptions{Transitions: TransitionTop1})
	r := Summary(s)
	assert.Equal(t, 3.0, r.Tokens)
	assert.True(t, r.HasTransitions)
	assert.Equal(t, "top1", r.TransitionMode)
	require.Len(t, r.PerLayer, 2)
	l0 := r.PerLayer[0]
	assert.Equal(t, 10, l0.Name)
	assert.Equal(t, 6.0, l0.Total)
	assert.Equal(t, 1.5, l0.Mean)
	assert.Equal(t, 2.0, l0.Skew)
	// loads 3,2,1,0: variance (2.25+0.25+0.25+2.25)/4 = 1.25
	assert.InDelta(t, 0.745356, l0.CV, 1e-6)
	// three pairs of weight 1 each, all in the top 4: share 1; each
	// non-empty row has a single entry.
	assert.Equal(t, 1.0, l0.TopPairShare)
	assert.Equal(t, 1.0, l0.RowMaxShare)
	assert.Equal(t, 0.0, r.PerLayer[1].TopPairShare)
	assert.Equal(t, r, Summary(s.Clone()), "deterministic")

	counts := Summary(StatsFromLoad([][]float64{{1, 1}}, 1))
	assert.False(t, counts.HasTransitions)
	assert.Equal(t, 1.0, counts.PerLayer[0].Skew)
	assert.Equal(t, 0.0, counts.PerLayer[0].CV)
}
