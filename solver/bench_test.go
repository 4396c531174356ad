package solver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	. "github.com/moetuner/moetuner/solver"
)

// benchSolve solves p with st in a b.Loop and reports quality next to
// speed: the modeled layer time relative to contiguous and greedy (same
// run), the busiest/mean GPU load, and the proven gap of the ILP model.
func benchSolve(b *testing.B, p Problem, st Strategy, opts Options) {
	ctx := context.Background()
	cont, err := Solve(ctx, p, Options{Strategy: StrategyContiguous})
	if err != nil {
		b.Fatal(err)
	}
	greedy, err := Solve(ctx, p, Options{Strategy: StrategyGreedy})
	if err != nil {
		b.Fatal(err)
	}
	var res *Result
	for b.Loop() {
		opts.Strategy = st
		res, err = Solve(ctx, p, opts)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(res.Objective/cont.Objective, "time/contiguous")
	b.ReportMetric(res.Objective/greedy.Objective, "time/greedy")
	b.ReportMetric(res.Report.MeanBalance, "max/mean")
	if res.Gap == res.Gap { // not NaN
		b.ReportMetric(100*res.Gap, "gap%")
	}
	if res.CostGap == res.CostGap {
		b.ReportMetric(100*res.CostGap, "cost-gap%")
	}
	b.ReportMetric(float64(res.Cols), "cols")
}

func BenchmarkMixtral(b *testing.B) {
	p := mixtralProblem(b)
	b.Run("joint", func(b *testing.B) { benchSolve(b, p, StrategyJoint, Options{RelGap: -1}) })
	b.Run("moetuner", func(b *testing.B) { benchSolve(b, p, StrategyMoETuner, Options{RelGap: -1}) })
}

func BenchmarkFLAME(b *testing.B) {
	for _, nodes := range []int{1, 2} {
		for _, flow := range []costmodel.Flow{costmodel.FlowHome, costmodel.FlowChain} {
			p := flameProblem(b, nodes, flow)
			b.Run(fmt.Sprintf("joint/%s/%dnode", flow, nodes), func(b *testing.B) {
				benchSolve(b, p, StrategyJoint, Options{TimeLimit: 10 * time.Second})
			})
			b.Run(fmt.Sprintf("moetuner/%s/%dnode", flow, nodes), func(b *testing.B) {
				benchSolve(b, p, StrategyMoETuner, Options{TimeLimit: 10 * time.Second, MoETunerEqualSizes: true})
			})
		}
	}
}
