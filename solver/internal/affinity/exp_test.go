package affinity

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
)

func remotePerTokenLayer(t *testing.T, sc costmodel.Scenario, plan *placement.Plan) (float64, *costmodel.Report) {
	rep, err := sc.Evaluate(plan)
	require.NoError(t, err)
	nic := 0.0
	for _, lr := range rep.Layers {
		nic += lr.CrossNodeBytes
	}
	return nic / 2 / sc.Model.TokenBytes() / sc.Stats.Tokens / float64(sc.Stats.Layers), rep
}

// expTrace is the experiments' trace: $TRACE, else the shared 32k trace.
func expTrace() string {
	if p := os.Getenv("TRACE"); p != "" {
		return p
	}
	return sharedfiles.Find("shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy")
}

func TestExperiment(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	path := expTrace()
	src, err := routing.Load(path, routing.LoadOptions{})
	require.NoError(t, err)
	st := src.Stats
	nodes, _ := strconv.Atoi(os.Getenv("NODES"))
	if nodes == 0 {
		nodes = 4
	}
	red := 32 * nodes / 4
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes = nodes
	m, _ := costmodel.ModelPreset("deepseek-v3")
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: red, Nodes: nodes, FixDuplicates: true})
	require.NoError(t, err)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchStaticMean}
	r0, rep0 := remotePerTokenLayer(t, sc, plan)
	t.Logf("eplb: remote %.4f time %.3fms imb %.4f", r0, rep0.TimeSec*1e3, rep0.MeanBalance)
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = (st.Experts + red) / c.GPUs()
	}
	lim, _ := time.ParseDuration(os.Getenv("LIMIT"))
	if lim == 0 {
		lim = 20 * time.Second
	}
	debugf = t.Logf
	t0 := time.Now()
	capR, _ := strconv.ParseFloat(os.Getenv("CAP"), 64)
	res, err := Solve(context.Background(), Problem{Scenario: sc, Slots: slots, Start: plan, MaxImbalance: capR}, Options{Limit: task.Limit{Deadline: time.Now().Add(lim)}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}})
	require.NoError(t, err)
	el := time.Since(t0)
	out := placement.FromReplicas(c.GPUs(), res.Copies, "affinity")
	require.NoError(t, out.Validate(placement.ValidateOptions{EqualSlots: true}))
	r1, rep1 := remotePerTokenLayer(t, sc, out)
	worst := 0.0
	for _, lr := range rep1.Layers {
		worst = max(worst, lr.Balance)
	}
	for _, l := range []int{0, 1, 2} {
		for i, rep := range []*costmodel.Report{rep0, rep1} {
			lr := rep.Layers[l]
			P := c.GPUsPerNode
			mx, tot, nv := 0.0, 0.0, 0.0
			for s := range lr.Dispatch {
				o, in, nvo := 0.0, 0.0, 0.0
				for d := range lr.Dispatch {
					if s/P != d/P {
						o += lr.Dispatch[s][d]
						in += lr.Dispatch[d][s]
					} else {
						nvo += lr.Dispatch[s][d]
					}
				}
				mx = max(mx, o, in)
				nv = max(nv, nvo)
				tot += o
			}
			t.Logf("layer %d plan %d: tail %v disp %v comb %v; NIC max/mean %.4f; NIC max %.3gB NV max %.3gB", l, i, lr.ComputeTail, lr.DispatchTime, lr.CombineTime, mx/(tot/float64(len(lr.Dispatch))), mx, nv)
		}
	}
	t.Logf("affinity: remote %.4f (%.2f%%) time %.3fms (%.2f%%) imb %.4f worst %.4f tries %d in %v", r1, (r1/r0-1)*100, rep1.TimeSec*1e3, (rep1.TimeSec/rep0.TimeSec-1)*100, rep1.MeanBalance, worst, res.Tries, el)
	for i, rep := range []*costmodel.Report{rep0, rep1} {
		ex, ports, most := busiestPorts(rep, c.GPUsPerNode)
		t.Logf("plan %d: busiest NIC port over the mean %.4f (mean over layers); %d ports are the busiest in some layer, none in more than %d", i, ex, ports, most)
	}
}

// busiestPorts returns a report's busiest NIC port (out or in, the
// dispatch's) over the mean port, averaged over the layers; how many
// ports are the busiest in some layer; and in how many layers, at most,
// one port is the busiest.
func busiestPorts(rep *costmodel.Report, P int) (excess float64, ports, most int) {
	hot := map[int]int{}
	for _, lr := range rep.Layers {
		out, in, mean := nicPorts(lr.Dispatch, P)
		top, at := -1.0, 0
		for g := range out {
			if out[g] > top {
				top, at = out[g], g
			}
			if in[g] > top {
				top, at = in[g], len(out)+g
			}
		}
		if mean > 0 {
			excess += top / mean
		}
		hot[at]++
	}
	for _, n := range hot {
		most = max(most, n)
	}
	return excess / float64(len(rep.Layers)), len(hot), most
}

// chainExperiment is the chain experiments' setup: the trace (TRACE) on
// NODES nodes of 8 GPUs (default 4), DeepSeek-V3, EPLB's plan and its
// report, and the slots.
func chainExperiment(t *testing.T) (costmodel.Scenario, *placement.Plan, *costmodel.Report, []int) {
	t.Helper()
	src, err := routing.Load(expTrace(), routing.LoadOptions{})
	require.NoError(t, err)
	st := src.Stats
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes, _ = strconv.Atoi(os.Getenv("NODES"))
	if c.Nodes == 0 {
		c.Nodes = 4
	}
	m, _ := costmodel.ModelPreset("deepseek-v3")
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{Nodes: c.Nodes})
	require.NoError(t, err)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Flow: costmodel.FlowChain}
	rep0, err := sc.Evaluate(plan)
	require.NoError(t, err)
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = st.Experts / c.GPUs()
	}
	return sc, plan, rep0, slots
}

func TestExperimentChain(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	sc, plan, rep0, slots := chainExperiment(t)
	c := sc.Cluster
	lim, _ := time.ParseDuration(os.Getenv("LIMIT"))
	if v := os.Getenv("SHARES"); v != "" {
		// The proxy's and the exact counters' shares of the limit.
		_, err := fmt.Sscanf(v, "%g,%g", &proxyShare, &exactShare)
		require.NoError(t, err)
		t.Logf("shares: proxy %g, exact %g", proxyShare, exactShare)
	}
	res, err := SolveChain(context.Background(), Problem{Scenario: sc, Slots: slots, Start: plan}, Options{Limit: task.Limit{Deadline: time.Now().Add(lim)}, Parallel: 2})
	require.NoError(t, err)
	out := placement.FromReplicas(c.GPUs(), res.Copies, "affinity")
	rep1, err := sc.Evaluate(out)
	require.NoError(t, err)
	worst := func(r *costmodel.Report) float64 {
		w := 0.0
		for _, lr := range r.Layers {
			w = max(w, lr.Balance)
		}
		return w
	}
	// The NIC ports of the dispatches: the busiest out and in port over
	// the mean, averaged over the layers (the busiest sets the time).
	for i, r := range []*costmodel.Report{rep0, rep1} {
		var so, si float64
		for _, lr := range r.Layers {
			if out, in, mean := nicPorts(lr.Dispatch, c.GPUsPerNode); mean > 0 {
				so += slices.Max(out) / mean
				si += slices.Max(in) / mean
			}
		}
		nl := float64(len(r.Layers))
		t.Logf("%s: compute %v, all-to-all %v, NIC ports' busiest/mean out %.4f, in %.4f", []string{"start", "plan"}[i], r.ComputeTail, r.CommTime, so/nl, si/nl)
	}
	t.Logf("cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f, worst %.4f → %.4f", rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanBalance, rep1.MeanBalance, worst(rep0), worst(rep1))
}

// TestExperimentChainCeiling asks how far the cross-node transitions alone
// could fall at EPLB's balance: the exact chain counters annealed hot on
// their NIC copies only (the time's weight made negligible), from EPLB's
// plan, with every layer's compute tail held to EPLB's; NODES, LIMIT and
// TRACE as TestExperimentChain. A heuristic, not a bound.
func TestExperimentChainCeiling(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	sc, plan, rep0, slots := chainExperiment(t)
	st, c := sc.Stats, sc.Cluster
	L := st.Layers
	copies := make([][][]placement.GPU, L)
	tcap := make([]float64, L)
	for l := range copies {
		copies[l] = plan.ExpertGPUs(l)
	}
	cx := newChainExact(Problem{Scenario: sc, Slots: slots, Start: plan}, copies, tcap)
	require.NotNil(t, cx)
	// CAPX=x lets every layer's compute tail rise to x times its mean
	// GPU's where that is above EPLB's tail (unset: EPLB's tail).
	capx, _ := strconv.ParseFloat(os.Getenv("CAPX"), 64)
	for l := range tcap {
		tcap[l] = cx.tail(l, -1, -1, 0) * (1 + 1e-12)
		if capx > 0 {
			sum, sl := 0.0, 0.0
			for g, x := range cx.gtok[l] {
				sum += x
				sl += cx.slots[g]
			}
			G := float64(len(cx.gtok[l]))
			tcap[l] = max(tcap[l], (capx*sum/G*cx.terms.PerTokenSec+sl/G*cx.terms.PerExpertSec)/cx.speed[0])
		}
	}
	cx.tie = 1e6 // the copies alone
	lim, _ := time.ParseDuration(os.Getenv("LIMIT"))
	dl := time.Now().Add(lim)
	scs := []*schedule{newSchedule(t.Context(), task.Limit{Deadline: dl}, 1), newSchedule(t.Context(), task.Limit{Deadline: dl}, 1)}
	gpu, n := cx.anneal(1, scs, len(scs), func(float64) bool { return true })
	rep1, err := sc.Evaluate(placement.FromReplicas(c.GPUs(), gpuCopies(gpu), "ceiling"))
	require.NoError(t, err)
	t.Logf("%d swaps; cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f, worst %.4f → %.4f", n, rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanBalance, rep1.MeanBalance, rep0.MaxBalance, rep1.MaxBalance)
}
