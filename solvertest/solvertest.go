// Package solvertest helps test and benchmark expert placements in Go
// tests: two small real traces embedded in the package (FLAME-MoE-290M
// per-token routing, Mixtral-8x7B expert counts; Apache-2.0), Problems
// built on them, and Check and Verify, which validate a Result the way
// moetuner's own tests do: the plan against the problem, the cost
// recomputed by costmodel, every bound below what it bounds.
//
// A test of a placement service might read:
//
//	p := solvertest.FLAME(2, 4, costmodel.FlowChain)
//	res, err := solver.Solve(ctx, p, solver.Options{TimeLimit: 5 * time.Second})
//	require.NoError(t, err)
//	solvertest.Verify(t, p, res)
//
// and a benchmark reports quality next to speed:
//
//	for b.Loop() { res, _ = solver.Solve(ctx, p, opts) }
//	solvertest.ReportRatio(b, res, solvertest.Baseline(b, p, solver.StrategyContiguous), "time/contiguous")
package solvertest

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

//go:embed data/flame-moe-290m.npy data/mixtral-8x7b.json
var data embed.FS

func load(name string, opts routing.LoadOptions) *routing.Stats {
	b, err := data.ReadFile("data/" + name)
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	src, err := routing.Read(bytes.NewReader(b), name, opts)
	if err != nil {
		panic(fmt.Sprintf("solvertest: embedded %s: %v", name, err))
	}
	return src.Stats
}

// FLAMEStats returns the per-token statistics of 1024 FLAME-MoE-290M
// tokens: 8 MoE layers (decoder layers 2..9) of 64 experts, top-6, with
// transitions, co-activation and every token's path. Each call returns a
// fresh copy.
func FLAMEStats() *routing.Stats {
	s := load("flame-moe-290m.npy", routing.LoadOptions{Experts: 64})
	s.LayerNames = []int{2, 3, 4, 5, 6, 7, 8, 9}
	return s
}

// MixtralStats returns Mixtral-8x7B's expert counts over 7 MMLU subjects:
// 32 layers of 8 experts, top-2, counts only. Each call returns a fresh
// copy.
func MixtralStats() *routing.Stats {
	return load("mixtral-8x7b.json", routing.LoadOptions{TopK: 2})
}

// FLAME returns a problem on FLAMEStats: nodes × gpusPerNode H100 GPUs
// (gpusPerNode must divide 64), the flame-moe-290m model preset, flow
// given, sequential mode.
func FLAME(nodes, gpusPerNode int, flow costmodel.Flow) solver.Problem {
	c, _ := costmodel.ClusterPreset("h100x8")
	c = c.WithNodes(nodes)
	c.GPUsPerNode = gpusPerNode
	m, _ := costmodel.ModelPreset("flame-moe-290m")
	return solver.Problem{Stats: FLAMEStats(), Cluster: c, Model: m, Flow: flow}
}

// Mixtral returns the problem moetuner plan solves without flags:
// MixtralStats on 4 GPUs of one H100 node (MoETuner's EP4 setting).
func Mixtral() solver.Problem {
	c, _ := costmodel.ClusterPreset("h100x8")
	c.GPUsPerNode = 4
	m, _ := costmodel.ModelPreset("mixtral-8x7b")
	return solver.Problem{Stats: MixtralStats(), Cluster: c, Model: m}
}

// Check validates r for p and returns the first inconsistency: a missing
// or invalid plan (wrong shape, an expert without a copy, two copies on
// one GPU, uneven slots where p's slots are even, except for the
// moetuner strategy's unequal clusters; Experts + RedundantSlots slots a
// layer for every strategy, since the ones that place one copy per expert
// fill the redundant slots with copies), an Objective or Report
// that is not the cost model's value of the plan, a bound above what it
// bounds (Bound above ModelObjective, CostBound above Objective, a layer's
// balance bound above its busiest load) or a status out of range.
func Check(p solver.Problem, r *solver.Result) error {
	if r == nil || r.Plan == nil {
		return errors.New("solvertest: no result or no plan")
	}
	opts := placement.ValidateOptions{Experts: p.Stats.Experts, Layers: p.Stats.Layers}
	switch {
	case p.SlotsPerGPU == nil && r.Strategy == solver.StrategyMoETuner:
		// The paper's ILP 1 sizes its clusters freely (within its bounds)
		// unless Options.MoETunerEqualSizes: GPUs may hold different counts.
	case p.SlotsPerGPU == nil:
		opts.EqualSlots = true
	default:
		opts.SlotsPerGPU = p.SlotsPerGPU
	}
	if err := r.Plan.Validate(opts); err != nil {
		return fmt.Errorf("solvertest: invalid plan: %w", err)
	}
	if r.Plan.GPUs != p.Cluster.GPUs() {
		return fmt.Errorf("solvertest: plan has %d GPUs, the cluster %d", r.Plan.GPUs, p.Cluster.GPUs())
	}
	want := len(r.Plan.Layers[0].SlotExpert)
	if p.SlotsPerGPU == nil && p.Current == nil {
		want = p.Stats.Experts + p.RedundantSlots
	}
	for l, lp := range r.Plan.Layers {
		if len(lp.SlotExpert) != want {
			return fmt.Errorf("solvertest: layer %d has %d slots, want %d", l, len(lp.SlotExpert), want)
		}
	}
	rep, err := p.Scenario().Evaluate(r.Plan)
	if err != nil {
		return fmt.Errorf("solvertest: the cost model refuses the plan: %w", err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }
	if !near(rep.TimeSec, r.Objective) || r.Report == nil || !near(rep.TimeSec, r.Report.TimeSec) {
		return fmt.Errorf("solvertest: Objective %.12g s, but the cost model gives the plan %.12g s", r.Objective, rep.TimeSec)
	}
	below := func(lo, hi float64) bool {
		return math.IsNaN(lo) || math.IsNaN(hi) || lo <= hi*(1+1e-9)+1e-15
	}
	if !below(r.Bound, r.ModelObjective) {
		return fmt.Errorf("solvertest: Bound %.12g above ModelObjective %.12g", r.Bound, r.ModelObjective)
	}
	if !below(r.CostBound, r.Objective) {
		return fmt.Errorf("solvertest: CostBound %.12g s above Objective %.12g s", r.CostBound, r.Objective)
	}
	if b := r.Balance; b != nil {
		if len(b.Layers) != p.Stats.Layers {
			return fmt.Errorf("solvertest: balance report has %d layers, want %d", len(b.Layers), p.Stats.Layers)
		}
		for l, lb := range b.Layers {
			if !below(lb.Bound, lb.Busiest) || !below(lb.Mean, lb.Busiest) {
				return fmt.Errorf("solvertest: layer %d: busiest %.9g below its bound %.9g or its mean %.9g", l, lb.Busiest, lb.Bound, lb.Mean)
			}
		}
	}
	if r.Status < solver.StatusOptimal || r.Status > solver.StatusStopped {
		return fmt.Errorf("solvertest: status %d out of range", r.Status)
	}
	return nil
}

// Verify fails tb (Fatal) unless Check(p, r) passes.
func Verify(tb testing.TB, p solver.Problem, r *solver.Result) {
	tb.Helper()
	if err := Check(p, r); err != nil {
		tb.Fatal(err)
	}
}

// Baseline solves p with a baseline strategy st (milliseconds), failing
// tb on error, and verifies the result.
func Baseline(tb testing.TB, p solver.Problem, st solver.Strategy) *solver.Result {
	tb.Helper()
	r, err := solver.Solve(context.Background(), p, solver.Options{Strategy: st})
	if err != nil {
		tb.Fatal(err)
	}
	Verify(tb, p, r)
	return r
}

// ReportRatio reports r's modeled time over base's as metric unit (for
// example "time/contiguous"), so that one go test -bench run shows speed
// and quality side by side.
func ReportRatio(b *testing.B, r, base *solver.Result, unit string) {
	b.ReportMetric(r.Objective/base.Objective, unit)
}
