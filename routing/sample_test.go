package routing

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPathSampleSize checks the sample size against its definition: the
// smallest n whose bound ε(n) meets the target, all tokens up to n₀, and
// the caps. It catches a size without the finite-population correction (n₀
// every time), one off by more than rounding, and a bound that is not met.
func TestPathSampleSize(t *testing.T) {
	tests := []struct {
		name      string
		tokens    int64
		layers, k int
		eps       float64
		wantKept  int64 // -1: check minimality only
		wantExact bool
	}{
		{"small trace kept whole", 32768, 58, 8, 0.01, 32768, true},
		{"n0 itself kept whole", 122500, 58, 8, 0.01, 122500, true},
		{"1M DeepSeek tokens", 1 << 20, 58, 8, 0.01, -1, false},
		{"just above n0", 122501, 58, 8, 0.01, -1, false},
		{"default target", 1 << 20, 58, 8, 0, -1, false},
		{"top-1 uses width 1", 10000, 4, 1, 0.01, -1, false},
		{"negative keeps all", 1 << 30, 58, 8, -1, 1 << 30, true},
		{"capped by MaxPatterns", 1 << 40, 2, 8, 0.001, MaxPatterns, false},
		{"capped by ids", 1 << 40, 200, 64, 0.01, maxSampleIDs / (200 * 64), false},
		{"empty", 0, 3, 2, 0.01, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, e := PathSampleSize(tc.tokens, tc.layers, tc.k, tc.eps)
			if tc.wantExact {
				assert.Equal(t, tc.wantKept, n)
				assert.Equal(t, 0.0, e)
				return
			}
			assert.Less(t, n, tc.tokens)
			assert.InDelta(t, pathStdErr(tc.tokens, n, tc.k), e, 1e-15)
			if tc.wantKept >= 0 {
				assert.Equal(t, tc.wantKept, n)
				return
			}
			eps := tc.eps
			if eps == 0 {
				eps = DefaultPathError
			}
			assert.LessOrEqual(t, e, eps*(1+1e-12), "the bound is met")
			assert.Greater(t, pathStdErr(tc.tokens, n-1, tc.k), eps, "one token fewer would miss it")
		})
	}
	// The worked number for the benchmark trace: n₀ = (7/0.02)² = 122500,
	// n = ⌈n₀·N/(N−1+n₀)⌉.
	n, _ := PathSampleSize(1<<20, 58, 8, 0.01)
	assert.Equal(t, int64(math.Ceil(122500*1048576.0/(1048575+122500))), n)
}

// driftTrace has tokens whose path changes along the trace: the first
// third reach few distinct "GPUs" (experts mod 4), the rest many, and the
// sources follow the position.
func driftTrace(rng *rand.Rand, T int) *Trace {
	const L, K, E = 2, 3, 16
	tr := randomTrace(rng, T, L, K, E, true, false)
	for tok := range T {
		tr.Source[tok] = int32(4 * tok / T)
		if tok < T/3 {
			for i := 0; i < L; i++ {
				g := rng.IntN(4)
				for j := range K {
					tr.IDs[(tok*L+i)*K+j] = int16(g + 4*j)
				}
			}
		}
	}
	return tr
}

// spread is the mean over tokens (weighted by pattern count) of the number
// of distinct experts mod 4 at layer 0, the kind of per-token quantity in
// [1, k] the cost model sums.
func spread(s *Stats) float64 {
	var sum, n float64
	for _, p := range s.Patterns {
		seen := map[int16]bool{}
		for _, e := range p.Experts[:s.TopK] {
			seen[e%4] = true
		}
		sum += p.Count * float64(len(seen))
		n += p.Count
	}
	return sum / n
}

// TestPathSampleUnbiased estimates a per-token mean from sampled patterns
// of traces whose paths drift along the trace, and requires the estimate
// within 4 stated standard errors of the exact mean and the weights to add
// up to the tokens. It catches a sample of the first (or last) tokens,
// which misses the drift, weights that do not add up, and a stated error
// smaller than the real one.
func TestPathSampleUnbiased(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 8 {
		tr := driftTrace(rng, 4000+trial*500)
		exact := tr.Stats(StatsOptions{PathError: -1})
		s := tr.Stats(StatsOptions{PathError: 0.05}) // n₀ = 400
		require.NoError(t, s.Validate())
		ps := s.PathSample
		require.True(t, ps.Sampled())
		want, _ := PathSampleSize(int64(tr.Tokens), tr.Layers, tr.TopK, 0.05)
		assert.Equal(t, want, ps.Kept)
		var sum float64
		for _, p := range s.Patterns {
			sum += p.Count
			// Every kept token carries the same weight N/n.
			m := p.Count / (float64(tr.Tokens) / float64(ps.Kept))
			assert.InDelta(t, math.Round(m), m, 1e-9)
		}
		assert.InDelta(t, float64(tr.Tokens), sum, 1e-9*float64(tr.Tokens))
		mu := spread(exact)
		assert.InDelta(t, mu, spread(s), 4*ps.RelStdErr*mu, "trial %d", trial)
		// Each source's share of the sample tracks its share of tokens.
		for r := range int32(4) {
			var got float64
			for _, p := range s.Patterns {
				if p.Source == r {
					got += p.Count
				}
			}
			assert.InDelta(t, 0.25, got/sum, 0.1, "source %d", r)
		}
	}
}

// TestPathSampleDeterministic: the same trace gives the same sampled
// stats, byte for byte in a stats file, on every run and for any
// GOMAXPROCS. It catches a sample seeded from the clock or from map order.
func TestPathSampleDeterministic(t *testing.T) {
	tr := driftTrace(rand.New(rand.NewPCG(1, 1)), 5000)
	write := func() []byte {
		var buf bytes.Buffer
		require.NoError(t, WriteStats(&buf, tr.Stats(StatsOptions{PathError: 0.05}), StatsMoetuner))
		return buf.Bytes()
	}
	first := write()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	assert.Equal(t, first, write())
	runtime.GOMAXPROCS(4)
	assert.Equal(t, first, write())
	assert.Contains(t, string(first), `"path_sample": {"tokens": 5000, "kept": `)
}

// TestMergePathSamples: merged samples add their tokens and kept paths,
// the pattern counts still add up to the tokens, the error is the
// stratified one, and exactly one sampling note describes the result. It
// catches a merge that keeps one side's PathSample, adds errors linearly,
// or repeats the note.
func TestMergePathSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	a := driftTrace(rng, 6000).Stats(StatsOptions{PathError: 0.05})
	b := driftTrace(rng, 2000).Stats(StatsOptions{PathError: 0.05})
	exact := handTrace()
	exact.Source = nil
	s := a.Clone()
	require.NoError(t, s.Merge(b))
	require.NoError(t, s.Validate())
	assert.Equal(t, a.PathSample.Tokens+b.PathSample.Tokens, s.PathSample.Tokens)
	assert.Equal(t, a.PathSample.Kept+b.PathSample.Kept, s.PathSample.Kept)
	want := math.Sqrt(math.Pow(6000*a.PathSample.RelStdErr, 2)+math.Pow(2000*b.PathSample.RelStdErr, 2)) / 8000
	assert.InDelta(t, want, s.PathSample.RelStdErr, 1e-12)
	assert.Less(t, s.PathSample.RelStdErr, max(a.PathSample.RelStdErr, b.PathSample.RelStdErr))
	notes := 0
	for _, n := range s.Notes {
		if len(n) >= len(notePathsSampled) && n[:len(notePathsSampled)] == notePathsSampled {
			notes++
			assert.Contains(t, n, "of 8000 tokens kept")
		}
	}
	assert.Equal(t, 1, notes, "%q", s.Notes)

	// Merging exact stats into sampled ones keeps the exact side whole.
	small := driftTrace(rng, 100).Stats(StatsOptions{})
	require.False(t, small.PathSample.Sampled())
	s2 := a.Clone()
	require.NoError(t, s2.Merge(small))
	assert.Equal(t, a.PathSample.Kept+100, s2.PathSample.Kept)
	assert.InDelta(t, a.PathSample.RelStdErr*6000/6100, s2.PathSample.RelStdErr, 1e-12)
}

// TestThinPatterns: thinning keeps the counts adding up to the tokens, at
// most n distinct paths, equal weights, and is deterministic. It catches
// a thinning that renormalises nothing or picks by key order.
func TestThinPatterns(t *testing.T) {
	tr := driftTrace(rand.New(rand.NewPCG(31, 32)), 3000)
	s := tr.Stats(StatsOptions{PathError: -1})
	th := thinStats(s, 200)
	require.NoError(t, th.Validate())
	assert.LessOrEqual(t, len(th.Patterns), 200)
	step := s.Tokens / 200
	for _, p := range th.Patterns {
		m := p.Count / step
		assert.InDelta(t, math.Round(m), m, 1e-9)
	}
	assert.Equal(t, int64(200), th.PathSample.Kept)
	assert.InDelta(t, 1/math.Sqrt(200), th.PathSample.RelStdErr, 1e-12) // (k−1)/2 = 1
	assert.InDelta(t, spread(s), spread(th), 4*th.PathSample.RelStdErr*spread(s))
	assert.Equal(t, th, thinStats(s, 200))
	assert.Len(t, s.Patterns, len(tr.Stats(StatsOptions{PathError: -1}).Patterns), "s is left alone")
}

// TestSort8 checks the sorting network on every 0/1 input, which by the
// 0-1 principle proves it sorts any input, and on random ids. It catches
// a missing or misplaced comparator.
func TestSort8(t *testing.T) {
	for bitsIn := range 256 {
		var v [8]int16
		for i := range v {
			v[i] = int16(bitsIn >> i & 1)
		}
		sort8(&v)
		assert.True(t, slices.IsSorted(v[:]), "%08b -> %v", bitsIn, v)
	}
	rng := rand.New(rand.NewPCG(61, 62))
	for range 1000 {
		var v [8]int16
		for i := range v {
			v[i] = int16(rng.IntN(600) - 300)
		}
		want := slices.Clone(v[:])
		slices.Sort(want)
		sort8(&v)
		assert.Equal(t, want, v[:])
	}
}
