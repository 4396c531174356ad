package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// RunInterleaved replays several workloads (typically one per plan) in
// rounds: round r runs every workload once, then the next round begins.
// The cpu backend interleaves the workloads inside a round GPU share by GPU
// share; other backends run them one after another, forward in even rounds
// and backward in odd ones, so no plan always runs first. Each GPUTime
// entry is then the median over the rounds, so slow phases of the machine
// hit every plan alike. rounds ≤ 1 runs each workload once. The
// measurements are returned in the order of ws. Compare does the same until
// the differences are resolved and says how sure they are.
func RunInterleaved(ctx context.Context, b Backend, ws []*Workload, rounds int, opts RunOptions) ([]*Measurement, error) {
	if len(ws) == 0 {
		return nil, errors.New("replay: no workloads")
	}
	var runs [][]*Measurement
	for r := range max(rounds, 1) {
		ms, err := runRound(ctx, b, ws, opts, r)
		if err != nil {
			return nil, err
		}
		runs = append(runs, ms)
	}
	out := make([]*Measurement, len(ws))
	for j := range ws {
		out[j] = aggregate(runs, j, opts)
	}
	return out, nil
}

// multiRunner is a backend that runs several workloads of the same shape
// interleaved in one pass (CPU).
type multiRunner interface {
	runAll(ctx context.Context, ws []*Workload, opts RunOptions) ([]*Measurement, error)
}

// runRound runs every workload once: in one interleaved pass when the
// backend can, else one after another, in reverse order on odd rounds.
func runRound(ctx context.Context, b Backend, ws []*Workload, opts RunOptions, round int) ([]*Measurement, error) {
	if mr, ok := b.(multiRunner); ok && len(ws) > 1 {
		return mr.runAll(ctx, ws, opts)
	}
	out := make([]*Measurement, len(ws))
	for k := range ws {
		j := k
		if round%2 == 1 {
			j = len(ws) - 1 - k
		}
		m, err := b.Run(ctx, ws[j], opts)
		if err != nil {
			return nil, err
		}
		out[j] = m
	}
	return out, nil
}

// aggregate returns workload j's measurement with every GPUTime entry the
// median over the rounds (a copy; the rounds are not modified).
func aggregate(runs [][]*Measurement, j int, opts RunOptions) *Measurement {
	m0 := runs[0][j]
	if len(runs) == 1 {
		return m0
	}
	m := *m0
	vals := make([]time.Duration, len(runs))
	m.GPUTime = make([][][]time.Duration, len(m0.GPUTime))
	for i := range m0.GPUTime {
		m.GPUTime[i] = make([][]time.Duration, len(m0.GPUTime[i]))
		for l := range m0.GPUTime[i] {
			m.GPUTime[i][l] = make([]time.Duration, len(m0.GPUTime[i][l]))
			for g := range m0.GPUTime[i][l] {
				for r, run := range runs {
					vals[r] = run[j].GPUTime[i][l][g]
				}
				m.GPUTime[i][l][g] = median(vals)
			}
		}
	}
	m.finish(opts)
	return &m
}

// Defaults of CompareOptions.
const (
	DefaultMinRounds  = 5
	DefaultMaxRounds  = 30
	DefaultLevel      = 0.95
	DefaultResolution = 0.01
	DefaultResamples  = 2000
)

// CompareOptions are the optional settings of Compare; the zero value runs
// DefaultMinRounds to DefaultMaxRounds rounds without a time budget and
// gives 95 % intervals from DefaultResamples bootstrap resamples.
type CompareOptions struct {
	// MinRounds is the fewest rounds before Compare may stop because the
	// differences are resolved; 0 means DefaultMinRounds.
	MinRounds int
	// MaxRounds caps the rounds; 0 means DefaultMaxRounds.
	MaxRounds int
	// Budget caps the wall-clock time: no round starts that would, at the
	// mean round time so far, end after it. At least one round always runs.
	// 0 means no budget.
	Budget time.Duration
	// Level is the confidence level of the intervals; 0 means DefaultLevel.
	Level float64
	// Resolution is the relative difference below which two plans count as
	// equal: a difference is resolved when its interval excludes 0, or lies
	// within ±Resolution. 0 means DefaultResolution (1 %).
	Resolution float64
	// Resamples is the number of bootstrap resamples; 0 means
	// DefaultResamples.
	Resamples int
	// Seed seeds the bootstrap's PCG generator; 0 means DefaultSeed. The same
	// rounds and seed give the same intervals.
	Seed uint64
	// Progress, when set, is called after every round.
	Progress func(CompareProgress)
}

func (o CompareOptions) withDefaults() CompareOptions {
	if o.MinRounds <= 0 {
		o.MinRounds = DefaultMinRounds
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = DefaultMaxRounds
	}
	if o.Level <= 0 || o.Level >= 1 {
		o.Level = DefaultLevel
	}
	if o.Resolution <= 0 {
		o.Resolution = DefaultResolution
	}
	if o.Resamples <= 0 {
		o.Resamples = DefaultResamples
	}
	if o.Seed == 0 {
		o.Seed = DefaultSeed
	}
	return o
}

// CompareProgress is what Compare reports after each round.
type CompareProgress struct {
	Round   int
	Elapsed time.Duration
	// Diffs are the differences so far (intervals NaN before two rounds).
	Diffs []PlanDiff
}

// Stop says why Compare stopped.
type Stop string

// The reasons Compare stops.
const (
	StopResolved    Stop = "resolved"    // every difference is resolved
	StopRounds      Stop = "max-rounds"  // CompareOptions.MaxRounds reached
	StopBudget      Stop = "budget"      // CompareOptions.Budget spent
	StopInterrupted Stop = "interrupted" // the context was done after at least one round
)

// Difference is the relative difference (other − first)/first of one
// summary between two plans, with a bootstrap confidence interval.
//
// The estimate is taken on the aggregate of all rounds (every GPUTime
// entry the median over rounds, as RunInterleaved reports). The interval is
// the percentile bootstrap over rounds: rounds are drawn with replacement,
// the same rounds for both plans (a round measured both, so they stay
// paired), the aggregate recomputed, and the (1−Level)/2 and (1+Level)/2
// quantiles of the resampled differences taken. With fewer than two rounds
// there is no interval: Lo and Hi are NaN.
type Difference struct {
	Estimate float64
	Lo, Hi   float64
	Level    float64
}

// MarshalJSON writes a missing interval (NaN) as null.
func (d Difference) MarshalJSON() ([]byte, error) {
	return json.Marshal(differenceJSON{Estimate: d.Estimate, Lo: nullable(d.Lo), Hi: nullable(d.Hi), Level: d.Level})
}

// UnmarshalJSON reads what MarshalJSON writes (null: NaN).
func (d *Difference) UnmarshalJSON(data []byte) error {
	var j differenceJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*d = Difference{Estimate: j.Estimate, Lo: math.NaN(), Hi: math.NaN(), Level: j.Level}
	if j.Lo != nil {
		d.Lo = *j.Lo
	}
	if j.Hi != nil {
		d.Hi = *j.Hi
	}
	return nil
}

type differenceJSON struct {
	Estimate float64  `json:"estimate"`
	Lo       *float64 `json:"lo"`
	Hi       *float64 `json:"hi"`
	Level    float64  `json:"level"`
}

func nullable(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// WithinNoise reports whether the interval contains 0 (or is missing):
// the measurement cannot tell which plan is faster.
func (d Difference) WithinNoise() bool {
	return !(d.Lo > 0 || d.Hi < 0)
}

// Resolved reports whether the interval excludes 0 or lies within
// ±resolution (the plans are then equal to within it).
func (d Difference) Resolved(resolution float64) bool {
	if math.IsNaN(d.Lo) || math.IsNaN(d.Hi) {
		return false
	}
	return !d.WithinNoise() || (d.Lo >= -resolution && d.Hi <= resolution)
}

// String formats d as "-6.4% [-8.1, -4.7]", with " within noise" appended
// when the interval contains 0, or "-6.4% (no interval: one round)".
func (d Difference) String() string {
	if math.IsNaN(d.Lo) || math.IsNaN(d.Hi) {
		return fmt.Sprintf("%+.1f%% (no interval: one round)", 100*d.Estimate)
	}
	s := fmt.Sprintf("%+.1f%% [%+.1f, %+.1f]", 100*d.Estimate, 100*d.Lo, 100*d.Hi)
	if d.WithinNoise() {
		s += " within noise"
	}
	return s
}

// PlanDiff holds one plan's differences against the first plan: Tail and
// Mean (Σ over layers of the per-layer tail and mean compute) and Time
// (E2E, Σ over layers of the layer time).
type PlanDiff struct {
	Tail Difference `json:"tail"`
	Mean Difference `json:"mean"`
	Time Difference `json:"layer_time"`
}

func (p PlanDiff) resolved(res float64) bool {
	return p.Tail.Resolved(res) && p.Mean.Resolved(res) && p.Time.Resolved(res)
}

// Comparison is the result of Compare.
type Comparison struct {
	// Measurements are the aggregates over all rounds, in the order of the
	// workloads (every GPUTime entry the median over rounds).
	Measurements []*Measurement `json:"-"`
	// Diffs[j-1] compares workload j with workload 0.
	Diffs []PlanDiff `json:"diffs"`
	// Rounds is the number of complete rounds; RoundTimes[r][j] is workload
	// j's (Tail, Mean, E2E) in round r, the raw material of the intervals.
	Rounds     int                `json:"rounds"`
	RoundTimes [][][3]float64     `json:"round_tail_mean_e2e_sec"`
	Stop       Stop               `json:"stop"`
	Elapsed    time.Duration      `json:"elapsed_ns"`
	Options    CompareOptionsJSON `json:"options"`
}

// CompareOptionsJSON records the settings a Comparison was made with.
type CompareOptionsJSON struct {
	MinRounds  int     `json:"min_rounds"`
	MaxRounds  int     `json:"max_rounds"`
	BudgetSec  float64 `json:"budget_sec"`
	Level      float64 `json:"level"`
	Resolution float64 `json:"resolution"`
	Resamples  int     `json:"resamples"`
	Seed       uint64  `json:"seed"`
}

// Compare replays the workloads (the first is the reference) in
// interleaved rounds, as RunInterleaved, until every difference against the
// first (tail, mean, layer time) is resolved (its confidence interval
// excludes 0 or lies within ±Resolution) after at least MinRounds rounds,
// or MaxRounds or the Budget is reached. A context done after at least one
// complete round stops it with StopInterrupted and what was measured; done
// before, it returns ctx.Err(). A deterministic backend (sim) gives zero-
// width intervals; one round suffices for it.
func Compare(ctx context.Context, b Backend, ws []*Workload, opts RunOptions, co CompareOptions) (*Comparison, error) {
	if len(ws) == 0 {
		return nil, errors.New("replay: no workloads")
	}
	co = co.withDefaults()
	start := time.Now()
	c := &Comparison{Stop: StopRounds, Options: CompareOptionsJSON{MinRounds: co.MinRounds, MaxRounds: co.MaxRounds,
		BudgetSec: co.Budget.Seconds(), Level: co.Level, Resolution: co.Resolution, Resamples: co.Resamples, Seed: co.Seed}}
	var runs [][]*Measurement
	for r := range co.MaxRounds {
		if el := time.Since(start); r > 0 && co.Budget > 0 && el+el/time.Duration(r) > co.Budget {
			c.Stop = StopBudget
			break
		}
		ms, err := runRound(ctx, b, ws, opts, r)
		if err != nil {
			if r > 0 && ctx.Err() != nil {
				c.Stop = StopInterrupted
				break
			}
			return nil, err
		}
		runs = append(runs, ms)
		c.Diffs = bootstrap(runs, opts, co)
		if co.Progress != nil {
			co.Progress(CompareProgress{Round: r + 1, Elapsed: time.Since(start), Diffs: c.Diffs})
		}
		if r+1 >= co.MinRounds && allResolved(c.Diffs, co.Resolution) {
			c.Stop = StopResolved
			break
		}
	}
	c.Rounds = len(runs)
	c.Elapsed = time.Since(start)
	for j := range ws {
		c.Measurements = append(c.Measurements, aggregate(runs, j, opts))
	}
	for _, ms := range runs {
		row := make([][3]float64, len(ms))
		for j, m := range ms {
			row[j] = [3]float64{m.Tail.Seconds(), m.Mean.Seconds(), m.E2E.Seconds()}
		}
		c.RoundTimes = append(c.RoundTimes, row)
	}
	return c, nil
}

func allResolved(ds []PlanDiff, res float64) bool {
	for _, d := range ds {
		if !d.resolved(res) {
			return false
		}
	}
	return true
}

// bootstrap returns every workload's differences against workload 0 over
// the rounds runs[r][j] (see Difference).
func bootstrap(runs [][]*Measurement, opts RunOptions, co CompareOptions) []PlanDiff {
	R, J := len(runs), len(runs[0])
	if J < 2 {
		return nil
	}
	// Every entry's values sorted once, with the rounds they came from, so
	// a resample's median is one pass over R values.
	type entry struct {
		vals   []time.Duration
		rounds []int
	}
	sorted := make([][]entry, J) // [j][flat (i, l, g)]
	for j := range J {
		for i := range runs[0][j].GPUTime {
			for l := range runs[0][j].GPUTime[i] {
				for g := range runs[0][j].GPUTime[i][l] {
					idx := make([]int, R)
					for r := range idx {
						idx[r] = r
					}
					slices.SortStableFunc(idx, func(a, b int) int {
						return cmpDur(runs[a][j].GPUTime[i][l][g], runs[b][j].GPUTime[i][l][g])
					})
					e := entry{vals: make([]time.Duration, R), rounds: idx}
					for k, r := range idx {
						e.vals[k] = runs[r][j].GPUTime[i][l][g]
					}
					sorted[j] = append(sorted[j], e)
				}
			}
		}
	}
	scratch := make([]Measurement, J)
	for j := range J {
		m := *runs[0][j]
		m.GPUTime = make([][][]time.Duration, len(m.GPUTime))
		for i, it := range runs[0][j].GPUTime {
			m.GPUTime[i] = make([][]time.Duration, len(it))
			for l, ly := range it {
				m.GPUTime[i][l] = make([]time.Duration, len(ly))
			}
		}
		scratch[j] = m
	}
	counts := make([]int, R)
	// summaries aggregates the rounds drawn counts[r] times each and returns
	// every workload's (Tail, Mean, E2E).
	summaries := func() [][3]float64 {
		out := make([][3]float64, J)
		for j := range J {
			m := &scratch[j]
			k := 0
			for i := range m.GPUTime {
				for l := range m.GPUTime[i] {
					for g := range m.GPUTime[i][l] {
						m.GPUTime[i][l][g] = weightedMedian(sorted[j][k].vals, sorted[j][k].rounds, counts, R)
						k++
					}
				}
			}
			m.finish(opts)
			out[j] = [3]float64{m.Tail.Seconds(), m.Mean.Seconds(), m.E2E.Seconds()}
		}
		return out
	}
	rel := func(s [][3]float64, j, x int) float64 {
		if s[0][x] == 0 {
			return 0
		}
		return s[j][x]/s[0][x] - 1
	}
	for r := range counts {
		counts[r] = 1
	}
	est := summaries()
	diffs := make([]PlanDiff, J-1)
	samples := make([][3][]float64, J-1)
	if R >= 2 {
		rng := rand.New(rand.NewPCG(co.Seed, co.Seed^0x9e3779b97f4a7c15))
		for range co.Resamples {
			clear(counts)
			for range R {
				counts[rng.IntN(R)]++
			}
			s := summaries()
			for j := 1; j < J; j++ {
				for x := range 3 {
					samples[j-1][x] = append(samples[j-1][x], rel(s, j, x))
				}
			}
		}
	}
	for j := 1; j < J; j++ {
		var d [3]Difference
		for x := range 3 {
			d[x] = Difference{Estimate: rel(est, j, x), Lo: math.NaN(), Hi: math.NaN(), Level: co.Level}
			if R >= 2 {
				d[x].Lo, d[x].Hi = percentile(samples[j-1][x], (1-co.Level)/2), percentile(samples[j-1][x], (1+co.Level)/2)
			}
		}
		diffs[j-1] = PlanDiff{Tail: d[0], Mean: d[1], Time: d[2]}
	}
	return diffs
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// weightedMedian returns the median of the multiset holding vals[k] (sorted
// ascending, from round rounds[k]) counts[rounds[k]] times, n values in
// all; as median, the mean of the two middle values for an even n.
func weightedMedian(vals []time.Duration, rounds []int, counts []int, n int) time.Duration {
	lo, hi := (n-1)/2, n/2 // positions of the middle values
	var a, b time.Duration
	seen := 0
	for k, v := range vals {
		c := counts[rounds[k]]
		if c == 0 {
			continue
		}
		if seen <= lo && lo < seen+c {
			a = v
		}
		if seen <= hi && hi < seen+c {
			b = v
			break
		}
		seen += c
	}
	return (a + b) / 2
}

// percentile returns the p-quantile of xs (sorted in place) by linear
// interpolation between order statistics.
func percentile(xs []float64, p float64) float64 {
	slices.Sort(xs)
	if len(xs) == 0 {
		return math.NaN()
	}
	pos := p * float64(len(xs)-1)
	i := int(math.Floor(pos))
	if i >= len(xs)-1 {
		return xs[len(xs)-1]
	}
	f := pos - float64(i)
	return xs[i]*(1-f) + xs[i+1]*f
}
