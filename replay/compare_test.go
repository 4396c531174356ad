package replay

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// noisy is a backend with known truth: GPU g of every layer takes
// base·scale[plan]·(1+g/10) times a shock shared by all plans in a round
// (machine state) times independent noise 1+sigma·N(0,1) per entry.
type noisy struct {
	scale        map[string]float64
	sigma, shock float64
	rng          *rand.Rand
	plans, calls int
}

func newNoisy(seed uint64, sigma, shock float64, scale map[string]float64) *noisy {
	return &noisy{scale: scale, sigma: sigma, shock: shock, rng: rand.New(rand.NewPCG(seed, 7)), plans: len(scale)}
}

func (*noisy) Name() string { return "noisy" }

func (n *noisy) Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	round := uint64(n.calls / n.plans)
	n.calls++
	shock := 1 + n.shock*rand.New(rand.NewPCG(round, 99)).NormFloat64()
	m := newMeasurement("noisy", w, opts)
	for i := range m.GPUTime {
		for l := range m.GPUTime[i] {
			for g := range m.GPUTime[i][l] {
				t := 1e-3 * n.scale[w.Plan.Strategy] * (1 + float64(g)/10) * shock * (1 + n.sigma*n.rng.NormFloat64())
				m.GPUTime[i][l][g] = secs(math.Max(t, 1e-6))
			}
		}
	}
	m.finish(opts)
	return m, nil
}

// twoPlans returns workloads of smallPlan named A and B (same work).
func twoPlans(t *testing.T) []*Workload {
	t.Helper()
	var ws []*Workload
	for _, name := range []string{"A", "B"} {
		p := smallPlan()
		p.Strategy = name
		w, err := NewWorkload(p, Input{Trace: smallTrace()}, WorkloadOptions{})
		require.NoError(t, err)
		ws = append(ws, w)
	}
	return ws
}

func TestWeightedMedianMatchesMedian(t *testing.T) {
	// The bootstrap's one-pass median over a resample (counts per round)
	// must equal median() of the expanded multiset; catches off-by-one
	// positions and even/odd mistakes.
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		R := 1 + rng.IntN(9)
		vals := make([]time.Duration, R)
		for r := range vals {
			vals[r] = time.Duration(rng.IntN(20))
		}
		idx := make([]int, R)
		for r := range idx {
			idx[r] = r
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmpDur(vals[a], vals[b]) })
		sorted := make([]time.Duration, R)
		for k, r := range idx {
			sorted[k] = vals[r]
		}
		counts := make([]int, R)
		var multi []time.Duration
		for range R {
			r := rng.IntN(R)
			counts[r]++
			multi = append(multi, vals[r])
		}
		require.Equal(t, median(multi), weightedMedian(sorted, idx, counts, R), "trial %d: vals %v counts %v", trial, vals, counts)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{4, 1, 3, 2, 5}
	assert.Equal(t, 1.0, percentile(xs, 0))
	assert.Equal(t, 5.0, percentile(xs, 1))
	assert.Equal(t, 3.0, percentile(xs, 0.5))
	assert.InDelta(t, 1.1, percentile(xs, 0.025), 1e-12)
	assert.True(t, math.IsNaN(percentile(nil, 0.5)))
}

func fixedRounds(r int) CompareOptions {
	return CompareOptions{MinRounds: r, MaxRounds: r, Resamples: 1000, Resolution: 1e-9}
}

// TestCompareKnownDifference: B is 5 % slower everywhere with 2 % noise;
// Compare must resolve it, the estimate lie near +5 % and every interval
// cover +5 % and exclude 0.
func TestCompareKnownDifference(t *testing.T) {
	ws := twoPlans(t)
	b := newNoisy(1, 0.02, 0, map[string]float64{"A": 1, "B": 1.05})
	c, err := Compare(context.Background(), b, ws, RunOptions{}, CompareOptions{MaxRounds: 40})
	require.NoError(t, err)
	assert.Equal(t, StopResolved, c.Stop)
	assert.GreaterOrEqual(t, c.Rounds, DefaultMinRounds)
	require.Len(t, c.Diffs, 1)
	for name, d := range map[string]Difference{"tail": c.Diffs[0].Tail, "mean": c.Diffs[0].Mean, "time": c.Diffs[0].Time} {
		assert.InDelta(t, 0.05, d.Estimate, 0.02, name)
		assert.Less(t, d.Lo, 0.05, name)
		assert.Greater(t, d.Hi, 0.05, name)
		assert.False(t, d.WithinNoise(), name)
		assert.Regexp(t, `^\+\d\.\d% \[\+\d\.\d, \+\d\.\d\]$`, d.String(), name)
	}
	require.Len(t, c.Measurements, 2)
	assert.Len(t, c.RoundTimes, c.Rounds)
	// The estimate is the aggregate the table shows.
	agg := c.Measurements[1].Tail.Seconds()/c.Measurements[0].Tail.Seconds() - 1
	assert.InDelta(t, agg, c.Diffs[0].Tail.Estimate, 1e-6)
}

// TestCompareCoverage runs 100 independent experiments of 10 rounds with a
// true difference of +6 % under 5 % noise, and 100 with none. The 95 %
// intervals must cover the truth in at least 85 of them (a bootstrap over
// rounds of medians is a little anti-conservative at 10 rounds), and must
// not always cover it trivially by being huge: B's difference of +6 % must
// be resolved in most experiments. It catches an interval computed from a
// single round or from the point estimate (zero width: coverage near 0),
// intervals that ignore the spread, and a wrong quantile.
func TestCompareCoverage(t *testing.T) {
	ws := twoPlans(t)
	covered, resolved, equalInside := 0, 0, 0
	const n = 100
	for seed := range uint64(n) {
		b := newNoisy(seed+1, 0.05, 0, map[string]float64{"A": 1, "B": 1.06})
		c, err := Compare(context.Background(), b, ws, RunOptions{}, fixedRounds(10))
		require.NoError(t, err)
		d := c.Diffs[0].Tail
		if d.Lo <= 0.06 && 0.06 <= d.Hi {
			covered++
		}
		if !d.WithinNoise() {
			resolved++
		}
		b = newNoisy(seed+1000, 0.05, 0, map[string]float64{"A": 1, "B": 1})
		c, err = Compare(context.Background(), b, ws, RunOptions{}, fixedRounds(10))
		require.NoError(t, err)
		if c.Diffs[0].Tail.WithinNoise() && c.Diffs[0].Time.WithinNoise() {
			equalInside++
		}
	}
	t.Logf("coverage of +6%%: %d/%d; resolved: %d/%d; equal plans within noise: %d/%d", covered, n, resolved, n, equalInside, n)
	assert.GreaterOrEqual(t, covered, 85)
	assert.GreaterOrEqual(t, resolved, 60)
	assert.GreaterOrEqual(t, equalInside, 85)
}

// TestCompareVarianceMatters: the same true difference (+2 %) measured
// with 0.5 % and with 10 % noise over the same number of rounds. The noisy
// interval must be several times wider and contain 0, the quiet one must
// exclude 0. It catches an interval that ignores the variance.
func TestCompareVarianceMatters(t *testing.T) {
	ws := twoPlans(t)
	width := func(sigma float64) Difference {
		b := newNoisy(3, sigma, 0, map[string]float64{"A": 1, "B": 1.02})
		c, err := Compare(context.Background(), b, ws, RunOptions{}, fixedRounds(6))
		require.NoError(t, err)
		return c.Diffs[0].Tail
	}
	quiet, loud := width(0.005), width(0.10)
	t.Logf("quiet %s, loud %s", quiet, loud)
	assert.False(t, quiet.WithinNoise())
	assert.True(t, loud.WithinNoise())
	assert.Contains(t, loud.String(), "within noise")
	assert.Greater(t, loud.Hi-loud.Lo, 5*(quiet.Hi-quiet.Lo))
}

// TestComparePaired: a shock of ±20 % per round hits both plans alike
// (machine state), B is 3 % slower, entry noise 0.5 %. Resampling rounds
// jointly keeps the pairs and resolves +3 %; resampling each plan's rounds
// independently would see ±20 % and call it noise.
func TestComparePaired(t *testing.T) {
	ws := twoPlans(t)
	b := newNoisy(5, 0.005, 0.2, map[string]float64{"A": 1, "B": 1.03})
	c, err := Compare(context.Background(), b, ws, RunOptions{}, fixedRounds(8))
	require.NoError(t, err)
	d := c.Diffs[0].Tail
	t.Logf("paired tail difference %s", d)
	assert.False(t, d.WithinNoise())
	assert.InDelta(t, 0.03, d.Estimate, 0.01)
}

// TestCompareOneRound: one round has no interval; it is never resolved and
// counts as within noise.
func TestCompareOneRound(t *testing.T) {
	ws := twoPlans(t)
	b := newNoisy(1, 0.02, 0, map[string]float64{"A": 1, "B": 1.5})
	c, err := Compare(context.Background(), b, ws, RunOptions{}, CompareOptions{MaxRounds: 1})
	require.NoError(t, err)
	assert.Equal(t, StopRounds, c.Stop)
	d := c.Diffs[0].Tail
	assert.True(t, math.IsNaN(d.Lo) && math.IsNaN(d.Hi))
	assert.True(t, d.WithinNoise())
	assert.False(t, d.Resolved(0.01))
	assert.Contains(t, d.String(), "no interval")
	assert.InDelta(t, 0.5, d.Estimate, 0.1)
}

func TestCompareStops(t *testing.T) {
	ws := twoPlans(t)
	t.Run("equal within resolution", func(t *testing.T) {
		// Identical plans with 0.2 % noise: the intervals straddle 0 but
		// lie within ±1 %, which resolves them as equal.
		b := newNoisy(2, 0.002, 0, map[string]float64{"A": 1, "B": 1})
		c, err := Compare(context.Background(), b, ws, RunOptions{}, CompareOptions{MaxRounds: 50})
		require.NoError(t, err)
		assert.Equal(t, StopResolved, c.Stop)
		assert.True(t, c.Diffs[0].Tail.WithinNoise())
		assert.True(t, c.Diffs[0].Tail.Resolved(0.01))
	})
	t.Run("max rounds", func(t *testing.T) {
		b := newNoisy(2, 0.05, 0, map[string]float64{"A": 1, "B": 1})
		c, err := Compare(context.Background(), b, ws, RunOptions{}, CompareOptions{MaxRounds: 7, Resolution: 1e-6})
		require.NoError(t, err)
		assert.Equal(t, StopRounds, c.Stop)
		assert.Equal(t, 7, c.Rounds)
	})
	t.Run("budget", func(t *testing.T) {
		b := &slow{noisy: newNoisy(2, 0.05, 0, map[string]float64{"A": 1, "B": 1}), d: 20 * time.Millisecond}
		c, err := Compare(context.Background(), b, ws, RunOptions{}, CompareOptions{MaxRounds: 1000, Budget: 200 * time.Millisecond, Resolution: 1e-6})
		require.NoError(t, err)
		assert.Equal(t, StopBudget, c.Stop)
		assert.Less(t, c.Rounds, 10)
		assert.GreaterOrEqual(t, c.Rounds, 1)
	})
	t.Run("interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b := newNoisy(2, 0.05, 0, map[string]float64{"A": 1, "B": 1})
		var seen []int
		c, err := Compare(ctx, b, ws, RunOptions{}, CompareOptions{MaxRounds: 20, Resolution: 1e-6, Progress: func(p CompareProgress) {
			seen = append(seen, p.Round)
			if p.Round == 3 {
				cancel()
			}
		}})
		require.NoError(t, err)
		assert.Equal(t, StopInterrupted, c.Stop)
		assert.Equal(t, 3, c.Rounds)
		assert.Equal(t, []int{1, 2, 3}, seen)
	})
	t.Run("cancelled before a round", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := Compare(ctx, newNoisy(2, 0.05, 0, map[string]float64{"A": 1, "B": 1}), ws, RunOptions{}, CompareOptions{})
		assert.ErrorIs(t, err, context.Canceled)
	})
}

type slow struct {
	*noisy
	d time.Duration
}

func (s *slow) Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	time.Sleep(s.d)
	return s.noisy.Run(ctx, w, opts)
}

// TestCompareSimExact: the deterministic backend gives zero-width
// intervals at the modeled difference.
func TestCompareSimExact(t *testing.T) {
	tr, c, m := loadFLAME(t)
	var ws []*Workload
	for _, name := range []string{"flame-contiguous.json", "flame-joint.json"} {
		w, err := NewWorkload(readPlan(t, name), Input{Trace: tr}, WorkloadOptions{})
		require.NoError(t, err)
		ws = append(ws, w)
	}
	cmp, err := Compare(context.Background(), Sim{}, ws, RunOptions{Cluster: c, Model: m}, CompareOptions{})
	require.NoError(t, err)
	assert.Equal(t, StopResolved, cmp.Stop)
	d := cmp.Diffs[0].Tail
	assert.Equal(t, d.Lo, d.Estimate)
	assert.Equal(t, d.Hi, d.Estimate)
	assert.Negative(t, d.Estimate)
}

// TestRunRoundAlternates: backends without an interleaved pass run the
// plans forward in even rounds and backward in odd ones.
func TestRunRoundAlternates(t *testing.T) {
	ws := twoPlans(t)
	rec := &recorder{}
	_, err := RunInterleaved(context.Background(), rec, ws, 4, RunOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"A", "B", "B", "A", "A", "B", "B", "A"}, rec.order)
}

type recorder struct{ order []string }

func (*recorder) Name() string { return "recorder" }
func (r *recorder) Run(_ context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	r.order = append(r.order, w.Plan.Strategy)
	m := newMeasurement("recorder", w, opts)
	m.finish(opts)
	return m, nil
}

func TestCPURunAllShapes(t *testing.T) {
	ws := twoPlans(t)
	other := &placement.Plan{GPUs: 1, Experts: 4, Strategy: "C", Layers: []placement.LayerPlan{
		{SlotExpert: smallPlan().Layers[1].SlotExpert, SlotGPU: make([]placement.GPU, 4)},
		{SlotExpert: smallPlan().Layers[1].SlotExpert, SlotGPU: make([]placement.GPU, 4)},
	}}
	w, err := NewWorkload(other, Input{Trace: smallTrace()}, WorkloadOptions{})
	require.NoError(t, err)
	_, err = CPU{Hidden: 8, FFN: 16}.runAll(context.Background(), []*Workload{ws[0], w}, RunOptions{Repeats: 1})
	assert.ErrorContains(t, err, "interleaved plans must replay the same routing data on the same GPUs")
	ms, err := CPU{Hidden: 8, FFN: 16}.runAll(context.Background(), ws, RunOptions{Repeats: 2})
	require.NoError(t, err)
	require.Len(t, ms, 2)
	for _, m := range ms {
		assert.Contains(t, m.ComputeNote, "2 plans interleaved GPU by GPU")
		assert.Positive(t, m.Tail)
	}
}

func TestDifferenceJSON(t *testing.T) {
	for _, d := range []Difference{{Estimate: -0.05, Lo: -0.07, Hi: -0.03, Level: 0.95}, {Estimate: 0.1, Lo: math.NaN(), Hi: math.NaN(), Level: 0.95}} {
		data, err := json.Marshal(d)
		require.NoError(t, err)
		var back Difference
		require.NoError(t, json.Unmarshal(data, &back))
		assert.Equal(t, d.String(), back.String(), string(data))
	}
	data, _ := json.Marshal(Difference{Lo: math.NaN(), Hi: math.NaN()})
	assert.JSONEq(t, `{"estimate":0,"lo":null,"hi":null,"level":0}`, string(data))
}
