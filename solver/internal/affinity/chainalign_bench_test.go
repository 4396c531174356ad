package affinity

import (
	"testing"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// BenchmarkChainAlign32k times the alignment's sweeps (chainAligner) on
// the shared 32k-token trace, 4 nodes × 8 GPUs, chain flow, from EPLB's
// plan, two goroutines: one op is four sweeps, the first looking back
// only. It reports the cross-node transitions per token-layer after them
// (cut/tok) against EPLB's (eplb/tok), as the exact counters count them.
// It skips when the trace is absent.
func BenchmarkChainAlign32k(b *testing.B) {
	st, c, m, plan := shared32k(b, 0)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Flow: costmodel.FlowChain}
	slots := plan.SlotsPerGPU(0)
	p := Problem{Scenario: sc, Slots: slots, Start: plan}
	L, E := st.Layers, st.Experts
	perTok := func(cs [][][]int32) float64 {
		gc := make([][][]placement.GPU, L)
		for l := range gc {
			gc[l] = make([][]placement.GPU, E)
			for e, gs := range cs[l] {
				gc[l][e] = []placement.GPU{placement.GPU(gs[0])}
			}
		}
		cx := newChainExact(p, gc, make([]float64, L))
		return sumF(cx.cut) / sumF(cx.cnt) / float64(L)
	}
	var copies [][][]int32
	fresh := func() [][][]int32 {
		cs := make([][][]int32, L)
		for l := range cs {
			cs[l] = make([][]int32, E)
			for e, gs := range plan.ExpertGPUs(l) {
				cs[l][e] = []int32{int32(gs[0])}
			}
		}
		return cs
	}
	for b.Loop() {
		copies = fresh()
		ag := newChainAligner(p, copies, 2)
		for sw := range 4 {
			ag.sweep(sw)
		}
	}
	b.ReportMetric(perTok(fresh()), "eplb/tok")
	b.ReportMetric(perTok(copies), "cut/tok")
}
