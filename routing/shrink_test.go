package routing

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shrinkTrace has T tokens from R ranks on E experts (top-2, 2 layers):
// with mix, a rank routes 80 % of its picks to its own block of experts;
// without, sources and experts are independent.
func shrinkTrace(rng *rand.Rand, T, R, E int, mix bool) *Trace {
	tr := &Trace{Tokens: T, Layers: 2, TopK: 2, Experts: E, Source: make([]int32, T)}
	block := E / R
	for t := range T {
		r := rng.IntN(R)
		tr.Source[t] = int32(r)
		for range 2 {
			a := rng.IntN(E)
			if mix && rng.IntN(5) > 0 {
				a = r*block + rng.IntN(block)
			}
			b := (a + 1 + rng.IntN(E-1)) % E
			tr.IDs = append(tr.IDs, int16(a), int16(b))
		}
	}
	return tr
}

// TestSourceReliability: the split-half reliability tells a real per-rank
// mix (near 1) from sampling noise (near 0), and ShrinkSources keeps every
// rank's and every expert's totals while removing what is noise.
func TestSourceReliability(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	real := shrinkTrace(rng, 20000, 4, 16, true).Stats(StatsOptions{PathError: -1})
	noise := shrinkTrace(rng, 20000, 4, 16, false).Stats(StatsOptions{PathError: -1})
	rr, rn := SourceReliability(real), SourceReliability(noise)
	require.Len(t, rr, 2)
	for l := range 2 {
		assert.Greater(t, rr[l], 0.95, "layer %d: a mix 80 %% of picks strong", l)
		assert.Less(t, rn[l], 0.5, "layer %d: independent sources", l)
	}
	for _, tc := range []struct {
		st  *Stats
		rel []float64
	}{{real, rr}, {noise, rn}, {noise, []float64{0, 0}}} {
		sh := ShrinkSources(tc.st, tc.rel)
		require.NotSame(t, tc.st, sh)
		for l := range 2 {
			for e := range tc.st.Experts {
				a, b := 0.0, 0.0
				for r := range tc.st.SourceLoad {
					a += tc.st.SourceLoad[r][l][e]
					b += sh.SourceLoad[r][l][e]
				}
				assert.InDelta(t, a, b, 1e-6, "expert %d's total", e)
			}
			for r := range tc.st.SourceLoad {
				a, b := 0.0, 0.0
				for e := range tc.st.Experts {
					a += tc.st.SourceLoad[r][l][e]
					b += sh.SourceLoad[r][l][e]
				}
				assert.InDelta(t, a, b, 1e-6, "rank %d's total", r)
			}
		}
	}
	// Reliability 0: every rank sends each expert its share of the tokens.
	flat := ShrinkSources(noise, []float64{0, 0})
	r0, e0, tot := 0.0, 0.0, 0.0
	for e := range noise.Experts {
		r0 += noise.SourceLoad[0][0][e]
		tot += noise.Load[0][e]
	}
	for r := range noise.SourceLoad {
		e0 += noise.SourceLoad[r][0][0]
	}
	assert.InDelta(t, r0*e0/tot, flat.SourceLoad[0][0][0], 1e-9)
	assert.Same(t, noise, ShrinkSources(noise, []float64{1}), "a reliability per layer is needed")
}
