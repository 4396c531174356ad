package rebalance

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestHarnessScoreHand: 60 s × 1.5 + 1000 slots × 88,080,384 B / 900 GB/s
// + 10 calls × 0.08 s, and the two parameters changed.
func TestHarnessScoreHand(t *testing.T) {
	s := Harness{}.Score(1.5, 1000, 10)
	assert.InDelta(t, 90, s.PARSec, 1e-12)
	assert.InDelta(t, 1000*88080384/900e9, s.TransitSec, 1e-15)
	assert.InDelta(t, 0.0978670933, s.TransitSec, 1e-10)
	assert.InDelta(t, 0.8, s.PlannerSec, 1e-12)
	assert.InDelta(t, 90+0.0978670933+0.8, s.TotalSec, 1e-9)
	s = Harness{BytesPerExpert: 9e8, CallSec: -1}.Score(1, 1, 3)
	assert.InDelta(t, 60.001, s.TotalSec, 1e-12)
	assert.Zero(t, s.PlannerSec)
}

// shiftingSeries: 4 experts on 2 GPUs; for the first half experts 0 and 2
// are hot, then 0 and 1 (which a plan for the first half keeps apart only
// by chance), with a little noise from a fixed seed.
func shiftingSeries(steps int) [][][]float64 {
	rng := rand.New(rand.NewPCG(4, 4))
	out := make([][][]float64, steps)
	for s := range out {
		hot := []float64{40, 4, 40, 4}
		if s >= steps/2 {
			hot = []float64{40, 40, 4, 4}
		}
		row := make([]float64, 4)
		for e := range row {
			row[e] = hot[e] + float64(rng.IntN(5))
		}
		out[s] = [][]float64{row}
	}
	return out
}

// recount is the test's own PAR of one layer: GPU loads with even
// splits over copies, busiest over mean.
func recount(lp placement.LayerPlan, G int, load []float64) float64 {
	copies := map[int]int{}
	for _, e := range lp.SlotExpert {
		copies[int(e)]++
	}
	gl := make([]float64, G)
	tot := 0.0
	for s, e := range lp.SlotExpert {
		gl[lp.SlotGPU[s]] += load[e] / float64(copies[int(e)])
	}
	busiest := 0.0
	for _, v := range gl {
		tot += v
		busiest = max(busiest, v)
	}
	return busiest / (tot / float64(G))
}

// TestBacktestAccounting: every policy's per-step PAR is the PAR of the
// plan its events put in force (recounted here), static never changes,
// the dynamic policies change plans only at their cadence, the rebalancer
// within its budget, the totals add up, and the balance as the (even)
// dispatch deals it is the PAR. Catches scoring a step with
// the plan made from it (look-ahead), counting the first plan as transit,
// and totals that drift from the events.
func TestBacktestAccounting(t *testing.T) {
	steps := shiftingSeries(40)
	cfg := BacktestConfig{Cluster: tinyCluster(1, 2), Model: tinyModel(1, 4, 1), Every: []int{5, 10}, MaxMoves: 2}
	var reports []StepProgress
	cfg.Step = func(sp StepProgress) { reports = append(reports, sp) }
	res, err := Backtest(context.Background(), steps, cfg)
	require.NoError(t, err)
	require.Equal(t, 10, res.FirstStep) // the largest cadence
	// Step is told every scored step of every policy, in order, with the
	// rebalances so far; the last report of a policy agrees with its result.
	require.Len(t, reports, 30*len(res.Policies))
	for i, p := range res.Policies {
		for s, sp := range reports[30*i : 30*(i+1)] {
			assert.Equal(t, StepProgress{Policy: p.Name, Done: s + 1, Steps: 30, Rebalances: sp.Rebalances}, sp)
		}
		assert.Equal(t, p.Rebalances, reports[30*i+29].Rebalances, p.Name)
	}
	names := []string{}
	for _, p := range res.Policies {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"static", "eplb/5", "eplb/10", "moetuner/5", "moetuner/10", "rebalance/5", "rebalance/10"}, names)
	for _, p := range res.Policies {
		require.Len(t, p.PAR, 30, p.Name)
		assert.Equal(t, len(p.Events), p.Calls, p.Name)
		assert.Zero(t, p.Events[0].MovedSlots, "%s: the first plan is what the server starts with", p.Name)
		assert.Equal(t, 10, p.Events[0].Step)
		moved, mean := 0, 0.0
		for i, ev := range p.Events {
			moved += ev.MovedSlots
			if i > 0 {
				assert.Zero(t, (ev.Step-10)%p.Every, "%s: event at step %d", p.Name, ev.Step)
				prev := p.Events[i-1].Plan
				assert.Equal(t, ev.MovedSlots, positionsChanged(prev.Layers[0], ev.Plan.Layers[0]), "%s at %d", p.Name, ev.Step)
				if p.Policy == PolicyRebalance {
					assert.LessOrEqual(t, ev.MovedSlots, 2)
				}
			}
		}
		ev := 0
		for s := 10; s < 40; s++ {
			for ev+1 < len(p.Events) && p.Events[ev+1].Step <= s {
				ev++
			}
			want := recount(p.Events[ev].Plan.Layers[0], 2, steps[s][0])
			assert.InDelta(t, want, p.PAR[s-10], 1e-12, "%s step %d", p.Name, s)
			mean += want / 30
		}
		assert.InDelta(t, mean, p.MeanPAR, 1e-12, p.Name)
		// The even dispatch on GPUs of one speed deals as PAR counts.
		assert.InDeltaSlice(t, p.PAR, p.Balance, 1e-12, p.Name)
		assert.InDelta(t, p.MeanPAR, p.MeanBalance, 1e-12, p.Name)
		assert.Equal(t, moved, p.MovedSlots, p.Name)
		assert.Equal(t, Harness{}.Score(p.MeanPAR, moved, p.Calls), p.Harness, p.Name)
		if p.Policy == PolicyStatic {
			assert.Equal(t, 1, p.Calls)
		}
	}
	// The shift after step 20 is one swap: the rebalancer makes it and
	// beats the static plan.
	static, reb := res.Policies[0], res.Policies[5]
	assert.Less(t, reb.MeanPAR, static.MeanPAR-0.1)
	assert.Positive(t, reb.MovedSlots)
	assert.NotEqual(t, "static", res.Recommendation.Best)
	assert.False(t, res.Recommendation.StaticEnough)
}

// TestBacktestDeterministic: two runs give the same results, planner wall
// times aside.
func TestBacktestDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	steps := make([][][]float64, 30)
	for s := range steps {
		steps[s] = skewedLoad(rng, 2, 8)
	}
	cfg := BacktestConfig{Cluster: tinyCluster(2, 2), Model: tinyModel(2, 8, 2), RedundantSlots: 4, Every: []int{4}, MaxMoves: 4}
	encode := func() []byte {
		res, err := Backtest(context.Background(), steps, cfg)
		require.NoError(t, err)
		for i := range res.Policies {
			res.Policies[i].PlannerSec = 0
			for j := range res.Policies[i].Events {
				res.Policies[i].Events[j].PlannerSec = 0
			}
		}
		data, err := json.Marshal(res)
		require.NoError(t, err)
		return data
	}
	assert.Equal(t, encode(), encode())
}

func TestBacktestErrors(t *testing.T) {
	steps := shiftingSeries(10)
	c, m := tinyCluster(1, 2), tinyModel(1, 4, 1)
	for _, tc := range []struct {
		name  string
		steps [][][]float64
		cfg   BacktestConfig
		want  string
	}{
		{"too short", steps, BacktestConfig{Cluster: c, Model: m, Every: []int{10}}, "the series has 10 steps and the first plan needs 10"},
		{"bad cadence", steps, BacktestConfig{Cluster: c, Model: m, Every: []int{0}}, "cadence 0"},
		{"shape", [][][]float64{{{1, 2, 3}}}, BacktestConfig{Cluster: c, Model: m}, "step 0 layer 0 has 3 experts, the model 4"},
		{"negative", [][][]float64{{{1, 2, 3, -4}}}, BacktestConfig{Cluster: c, Model: m}, "load[0][3] = -4"},
		{"phases", steps, BacktestConfig{Cluster: c, Model: m, Every: []int{2}, Phases: []Phase{PhaseDecode}}, "1 phases for 10 steps"},
		{"no model", steps, BacktestConfig{Cluster: c}, "BacktestConfig.Model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Backtest(context.Background(), tc.steps, tc.cfg)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// TestRecommend: the best harness score wins unless static is within the
// noise margin (2 × 60 s × the standard error of the per-step PAR
// difference).
func TestRecommend(t *testing.T) {
	par := func(vs ...float64) []float64 { return vs }
	mk := func(name string, pol Policy, every int, p []float64, extra float64) PolicyResult {
		mean := 0.0
		for _, v := range p {
			mean += v / float64(len(p))
		}
		return PolicyResult{Name: name, Policy: pol, Every: every, PAR: p, MeanPAR: mean,
			Harness: HarnessScore{TotalSec: 60*mean + extra}}
	}
	// Differences 0.1, 0.3: mean 0.2, sd 0.1414, se 0.1, margin 12 s;
	// static trails by 12 s − 0.5 s transit = 11.5 s: within the margin.
	static := mk("static", PolicyStatic, 0, par(1.4, 1.6), 0)
	noisy := mk("rebalance/10", PolicyRebalance, 10, par(1.3, 1.3), 0.5)
	r := recommend([]PolicyResult{static, noisy})
	assert.Equal(t, "rebalance/10", r.Best)
	assert.InDelta(t, 12, r.MarginSec, 1e-9)
	assert.True(t, r.StaticEnough)
	assert.Contains(t, r.Text, "a static plan is enough")
	// Consistent differences (0.2 at every step): margin 0, rebalance.
	steady := mk("rebalance/10", PolicyRebalance, 10, par(1.2, 1.4), 0.5)
	r = recommend([]PolicyResult{static, steady})
	assert.False(t, r.StaticEnough)
	assert.InDelta(t, 0, r.MarginSec, 1e-9)
	assert.Contains(t, r.Text, "rebalance every 10 steps with rebalance")
	r = recommend([]PolicyResult{static, mk("eplb/10", PolicyEPLB, 10, par(1.5, 1.7), 0)})
	assert.Equal(t, "static", r.Best)
	assert.True(t, r.StaticEnough)
}

// TestBacktestEPLBDealtAsStackRuns: under SGLang's static tables the EPLB
// policy's plans are dealt as the stack deals what it computes itself
// (init_by_eplb). Every scored step's Balance is costmodel's balance, on
// that step, of EPLB's own plan for the window before it built with its
// log2phy (baseline.EPLBOptions.StackEPLB, as compare builds its eplb
// row), and on this instance it differs from the same plan loaded from a
// file (init_by_mapping), so a policy that dropped the log2phy, or an
// Align that left it naming the unaligned slots, fails. The slots moved,
// the migration and the PAR are those of the run under the even dispatch,
// whose plans carry no log2phy: it changes only the deal. 2 nodes × 4
// GPUs, 32 experts, 16 redundant slots, one dense decoder layer before the
// two MoE layers (its deal draws from the stream first).
func TestBacktestEPLBDealtAsStackRuns(t *testing.T) {
	const G, E, redundant, first, every = 8, 32, 16, 10, 5
	rng := rand.New(rand.NewPCG(36, 1))
	steps := make([][][]float64, 30)
	for s := range steps {
		steps[s] = skewedLoad(rng, 2, E)
	}
	c, m := tinyCluster(2, 4), tinyModel(2, E, 4)
	m.DecoderLayers = 3
	cfg := BacktestConfig{Cluster: c, Model: m, RedundantSlots: redundant, Every: []int{every}, FirstWindow: first, Policies: []Policy{PolicyEPLB}}
	even, err := Backtest(context.Background(), steps, cfg)
	require.NoError(t, err)
	q := even.Policies[0]
	assert.Nil(t, q.Events[1].Plan.StackEPLB, "the even dispatch deals no table")
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStatic, placement.DispatchSGLangStaticNarrow} {
		t.Run(d.String(), func(t *testing.T) {
			cfg := cfg
			cfg.Dispatch = d
			res, err := Backtest(context.Background(), steps, cfg)
			require.NoError(t, err)
			require.Len(t, res.Policies, 1)
			p := res.Policies[0]
			require.Len(t, p.Balance, len(steps)-first)
			require.Len(t, p.Events, 4)
			var mapped, mean, gap float64
			for k, ev := range p.Events {
				require.NotNil(t, ev.Plan.StackEPLB, "event %d", k)
				lo := max(0, ev.Step-every)
				if k == 0 {
					lo = 0
				}
				own, err := baseline.EPLB(routing.StatsFromLoad(sumSteps(steps[lo:ev.Step]), m.TopK), G, baseline.EPLBOptions{
					RedundantSlots: redundant, Nodes: c.Nodes, FixDuplicates: true, StackEPLB: true})
				require.NoError(t, err)
				loaded := own.Clone()
				loaded.StackEPLB = nil
				for l := range own.Layers {
					require.Equal(t, own.ExpertGPUs(l), ev.Plan.ExpertGPUs(l), "event %d layer %d: EPLB's copies", k, l)
				}
				for s := ev.Step; s < min(ev.Step+every, len(steps)); s++ {
					opts := costmodel.Options{Dispatch: d}
					want, err := costmodel.Evaluate(own, routing.StatsFromLoad(steps[s], m.TopK), c, m, opts)
					require.NoError(t, err)
					asMap, err := costmodel.Evaluate(loaded, routing.StatsFromLoad(steps[s], m.TopK), c, m, opts)
					require.NoError(t, err)
					assert.InDelta(t, want.MeanBalance, p.Balance[s-first], 1e-12, "step %d", s)
					mean += want.MeanBalance / float64(len(steps)-first)
					mapped += asMap.MeanBalance / float64(len(steps)-first)
					gap += math.Abs(want.MeanBalance - asMap.MeanBalance)
				}
			}
			assert.InDelta(t, mean, p.MeanBalance, 1e-12)
			t.Logf("mean balance as dealt: init_by_eplb %.6f, init_by_mapping %.6f", mean, mapped)
			assert.Greater(t, gap, 1e-3, "init_by_eplb and init_by_mapping deal this instance alike: the test cannot tell them apart")
			assert.Equal(t, q.PAR, p.PAR)
			assert.Equal(t, q.MovedSlots, p.MovedSlots)
			assert.Equal(t, q.MigrationSec, p.MigrationSec)
			for k := range q.Events {
				assert.Equal(t, q.Events[k].Moved, p.Events[k].Moved, "event %d", k)
				assert.True(t, q.Events[k].Plan.Equal(p.Events[k].Plan), "event %d: the same slots", k)
			}
		})
	}
}

// sumSteps adds up steps' loads.
func sumSteps(steps [][][]float64) [][]float64 {
	out := make([][]float64, len(steps[0]))
	for l := range out {
		out[l] = make([]float64, len(steps[0][l]))
		for _, st := range steps {
			for e, v := range st[l] {
				out[l][e] += v
			}
		}
	}
	return out
}
