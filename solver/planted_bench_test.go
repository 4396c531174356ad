package solver

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// BenchmarkPlanted scores joint against EPLB and against the planted plan
// on traces with a planted node structure at DeepSeek-V3's shape (256
// experts, 58 layers, top-8, 32,768 tokens, 4 nodes × 8 GPUs, one copy of
// every expert, 30 s): chain, blocks of experts that persist over the
// layers (a token's topic at random); home, each home node's tokens
// taking their experts from one block per layer. One token-expert in ten
// strays; popularity is Zipf 0.8 within and across blocks.
func BenchmarkPlanted(b *testing.B) {
	m, err := costmodel.ModelPreset("deepseek-v3")
	if err != nil {
		b.Fatal(err)
	}
	c, err := costmodel.ClusterPreset("4xh100x8")
	if err != nil {
		b.Fatal(err)
	}
	for _, flow := range []costmodel.Flow{costmodel.FlowChain, costmodel.FlowHome} {
		b.Run(flow.String(), func(b *testing.B) {
			pl := testkit.Planted{Nodes: c.Nodes, GPUsPerNode: c.GPUsPerNode, SlotsPerGPU: 8, Layers: 58, TopK: 8, Tokens: 32768,
				Stray: 10, Skew: 0.8, HomeTopics: flow == costmodel.FlowHome}
			tr, planted := pl.Trace(rand.New(rand.NewPCG(1, uint64(flow))))
			if err := tr.Validate(); err != nil {
				b.Fatal(err)
			}
			p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: c, Model: m, Flow: flow}
			ctx := context.Background()
			eplb, err := Solve(ctx, p, Options{Strategy: StrategyEPLB})
			if err != nil {
				b.Fatal(err)
			}
			pr, err := p.Scenario().Evaluate(planted)
			if err != nil {
				b.Fatal(err)
			}
			var res *Result
			for b.Loop() {
				if res, err = Solve(ctx, p, Options{Strategy: StrategyJoint, TimeLimit: 30 * time.Second}); err != nil {
					b.Fatal(err)
				}
			}
			remote := func(r *costmodel.Report) float64 {
				v := 0.0
				for _, lr := range r.Layers {
					v += lr.RemoteCopies
				}
				return v / (p.Stats.Tokens * float64(p.Stats.Layers))
			}
			b.ReportMetric(remote(res.Report), "remote/token-layer")
			b.ReportMetric(remote(pr), "planted-remote")
			b.ReportMetric(remote(eplb.Report), "eplb-remote")
			b.ReportMetric(remote(res.Report)/remote(pr), "remote/planted")
			b.ReportMetric(res.Objective/pr.TimeSec, "time/planted")
			b.ReportMetric(res.Objective/eplb.Objective, "time/eplb")
		})
	}
}
