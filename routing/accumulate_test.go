package routing

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomTrace draws a valid trace: T tokens, L layers, top-k of E experts,
// with sources (some unknown) and steps when asked.
func randomTrace(rng *rand.Rand, T, L, K, E int, sources, steps bool) *Trace {
	t := &Trace{Tokens: T, Layers: L, TopK: K, Experts: E, IDs: make([]int16, T*L*K)}
	for i := 0; i < T*L; i++ {
		perm := rng.Perm(E)[:K]
		for j, e := range perm {
			t.IDs[i*K+j] = int16(e)
		}
	}
	if sources {
		t.Source = make([]int32, T)
		for i := range t.Source {
			t.Source[i] = int32(rng.IntN(5)) - 1
		}
	}
	if steps {
		t.Step = make([]int32, T)
		for i := range t.Step {
			t.Step[i] = int32(rng.IntN(4) * 3)
		}
	}
	return t
}

// TestStatsMatchReference compares the layer-by-layer uint32 counters with
// the token-by-token reference on random traces, exact paths kept. It
// catches a miscounted pair (co-activation kept for a < b but not mirrored,
// a transition into the wrong layer, a top-1 pair from the sorted instead of
// the recorded order), a lost chunk and a per-source or per-step load
// credited to the wrong row.
func TestStatsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := []struct{ T, L, K, E int }{
		{1, 1, 1, 1}, {7, 1, 3, 5}, {50, 3, 2, 6}, {300, 4, 4, 9}, {5000, 2, 3, 17}, {40, 5, 8, 8},
	}
	for _, sh := range shapes {
		for _, mode := range []TransitionMode{TransitionAllPairs, TransitionTop1} {
			name := fmt.Sprintf("T%d-L%d-K%d-E%d-%s", sh.T, sh.L, sh.K, sh.E, mode)
			t.Run(name, func(t *testing.T) {
				tr := randomTrace(rng, sh.T, sh.L, sh.K, sh.E, true, true)
				require.NoError(t, tr.Validate())
				want := referenceStats(tr, StatsOptions{Transitions: mode})
				got := tr.Stats(StatsOptions{Transitions: mode, PathError: -1})
				require.NoError(t, got.Validate())
				assert.Equal(t, want.Load, got.Load)
				assert.Equal(t, want.Transitions, got.Transitions)
				assert.Equal(t, want.CoActivation, got.CoActivation)
				assert.Equal(t, want.StepLoad, got.StepLoad)
				assert.Equal(t, want.SourceLoad, got.SourceLoad)
				assert.Equal(t, want.Patterns, got.Patterns)
				assert.Equal(t, PathSample{Tokens: int64(sh.T), Kept: int64(sh.T)}, got.PathSample)
				// Under the default path error these traces are small
				// enough to keep every path.
				def := tr.Stats(StatsOptions{Transitions: mode})
				assert.Equal(t, want.Patterns, def.Patterns)
				assert.Nil(t, def.Notes)
			})
		}
	}
}

// feed counts tr into a counter that does not know the number of experts,
// in chunks of random sizes, as the streaming readers do.
func feed(rng *rand.Rand, tr *Trace, opts StatsOptions, experts int) *counter {
	c := newCounter(tr.Layers, tr.TopK, experts, opts.Transitions, sampleCapacity(0, tr.Layers, tr.TopK, opts))
	LK := tr.Layers * tr.TopK
	for tok := 0; tok < tr.Tokens; {
		n := min(1+rng.IntN(40), tr.Tokens-tok)
		ids := tr.IDs[tok*LK : (tok+n)*LK]
		c.grow(int(slices.Max(ids)))
		var src, step []int32
		if tr.Source != nil {
			src = tr.Source[tok : tok+n]
		}
		if tr.Step != nil {
			step = tr.Step[tok : tok+n]
		}
		c.add(ids, n, src, step, int64(tok))
		tok += n
	}
	return c
}

// TestCounterGrowsStride streams traces whose ids grow (so the matrices are
// laid out again several times) and checks the stats equal those of the
// whole trace. It catches a re-layout that loses or shifts counts.
func TestCounterGrowsStride(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct{ T, L, K, E int }{{400, 3, 2, 40}, {100, 2, 3, 300}, {60, 1, 2, 3}} {
		t.Run(fmt.Sprintf("E%d", sh.E), func(t *testing.T) {
			tr := randomTrace(rng, sh.T, sh.L, sh.K, sh.E, true, true)
			// Token t uses only experts below a bound that grows with t.
			LK := sh.L * sh.K
			for tok := range sh.T {
				bound := max(sh.K, (tok+1)*sh.E/sh.T)
				for i := 0; i < sh.L; i++ {
					perm := rng.Perm(bound)[:sh.K]
					for j, e := range perm {
						tr.IDs[tok*LK+i*sh.K+j] = int16(e)
					}
				}
			}
			tr.Experts = int(slices.Max(tr.IDs)) + 1
			require.NoError(t, tr.Validate())
			want := tr.Stats(StatsOptions{})
			got := feed(rng, tr, StatsOptions{}, 0).stats(0, 0)
			assert.Equal(t, want.Experts, got.Experts)
			assert.Equal(t, want.Load, got.Load)
			assert.Equal(t, want.Transitions, got.Transitions)
			assert.Equal(t, want.CoActivation, got.CoActivation)
			assert.Equal(t, want.StepLoad, got.StepLoad)
			assert.Equal(t, want.SourceLoad, got.SourceLoad)
			assert.Equal(t, want.Patterns, got.Patterns)
		})
	}
}

// TestCounterMergeAnyOrder counts parts of a trace on separate counters
// and merges them in different orders: the result, path sample included,
// must equal counting the whole trace in one go. It catches a sample that
// depends on the order tokens arrive in (a reservoir driven by one random
// stream, say), which would make the result depend on GOMAXPROCS.
func TestCounterMergeAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tr := randomTrace(rng, 3000, 3, 2, 12, true, false)
	opts := StatsOptions{PathError: 0.1} // n₀ = 25: a real sample
	want := tr.Stats(opts)
	require.True(t, want.PathSample.Sampled())
	for _, order := range [][]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}} {
		cuts := []int{0, 700, 2100, 3000}
		parts := make([]*counter, 3)
		for i := range parts {
			part := tr.Slice(cuts[i], cuts[i+1])
			c := newCounter(tr.Layers, tr.TopK, 0, opts.Transitions, sampleCapacity(int64(tr.Tokens), tr.Layers, tr.TopK, opts))
			c.grow(int(slices.Max(part.IDs)))
			c.add(part.IDs, part.Tokens, part.Source, nil, int64(cuts[i]))
			parts[i] = c
		}
		// One part flushed its uint32 counts to float64, as a long trace
		// does: merging must add both kinds.
		parts[1].flush()
		total := parts[order[0]]
		total.merge(parts[order[1]])
		total.merge(parts[order[2]])
		got := total.stats(tr.Experts, opts.PathError)
		assert.Equal(t, want.Load, got.Load)
		assert.Equal(t, want.Transitions, got.Transitions)
		assert.Equal(t, want.CoActivation, got.CoActivation)
		assert.Equal(t, want.SourceLoad, got.SourceLoad)
		assert.Equal(t, want.Patterns, got.Patterns, "order %v", order)
		assert.Equal(t, want.PathSample, got.PathSample)
	}
}

// TestDenseLimits: a trace with too many experts for dense matrices says
// so in a note, and a hostile source rank drops the per-source loads with
// a note instead of allocating for it.
func TestDenseLimits(t *testing.T) {
	tr := &Trace{Tokens: 2, Layers: 2, TopK: 1, Experts: 4000, IDs: []int16{0, 3999, 5, 6}, Source: []int32{0, 1 << 30}}
	require.NoError(t, tr.Validate())
	s := tr.Stats(StatsOptions{})
	require.NoError(t, s.Validate())
	assert.Nil(t, s.Transitions)
	assert.Nil(t, s.CoActivation)
	assert.Nil(t, s.SourceLoad)
	require.Len(t, s.Notes, 2)
	assert.Contains(t, s.Notes[0], "transitions and co-activation dropped: 2 layers × 4000² experts")
	assert.Contains(t, s.Notes[0], "chain flow then needs per-token paths")
	assert.Contains(t, s.Notes[1], "per-source loads dropped")
	assert.Equal(t, 1.0, s.Load[1][3999])

	// The same through a counter that learns the experts from the ids.
	c := feed(rand.New(rand.NewPCG(1, 1)), tr, StatsOptions{}, 0)
	got := c.stats(0, 0)
	assert.Equal(t, s.Notes, got.Notes)
	assert.Equal(t, s.Load, got.Load)

	steps := &Trace{Tokens: 3, Layers: 1, TopK: 1, Experts: 1 << 15, IDs: []int16{1, 2, 3}, Step: []int32{0, 1, 2}}
	require.NoError(t, steps.Validate())
	s = steps.Stats(StatsOptions{NoPatterns: true})
	assert.Len(t, s.StepLoad, 3, "3 steps × 2^15 experts fit")
	big := randomTrace(rand.New(rand.NewPCG(2, 2)), maxStepEntries>>15+1, 1, 1, 1<<15, false, false)
	big.Step = make([]int32, big.Tokens)
	for i := range big.Step {
		big.Step[i] = int32(i)
	}
	s = big.Stats(StatsOptions{NoPatterns: true})
	assert.Nil(t, s.StepLoad, "one step per token past the cap")
	assert.Contains(t, s.Notes[len(s.Notes)-1], "per-step loads dropped")
	assert.InDelta(t, float64(big.Tokens), s.LayerTotal(0), 0)
}

func TestUint32Flush(t *testing.T) {
	// Flushing early must not change a count.
	tr := randomTrace(rand.New(rand.NewPCG(7, 7)), 200, 2, 2, 5, false, false)
	c := newCounter(2, 2, 5, TransitionAllPairs, 0)
	c.add(tr.IDs[:100*4], 100, nil, nil, 0)
	c.flush()
	c.add(tr.IDs[100*4:], 100, nil, nil, 100)
	got := c.stats(5, 0)
	want := tr.Stats(StatsOptions{NoPatterns: true})
	assert.Equal(t, want.Transitions, got.Transitions)
	assert.Equal(t, want.CoActivation, got.CoActivation)
	assert.False(t, math.IsNaN(got.Tokens))
}
