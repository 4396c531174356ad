package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// chainSetup is the chain experiments' setup: st on nodes nodes of 8
// GPUs, DeepSeek-V3, the chain flow, EPLB's plan (one copy per expert)
// and its report, and the slots.
func chainSetup(st *routing.Stats, nodes int) (costmodel.Scenario, *placement.Plan, *costmodel.Report, []int, error) {
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes = nodes
	m, _ := costmodel.ModelPreset("deepseek-v3")
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{Nodes: c.Nodes})
	if err != nil {
		return costmodel.Scenario{}, nil, nil, nil, err
	}
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Flow: costmodel.FlowChain}
	rep0, err := sc.Evaluate(plan)
	if err != nil {
		return costmodel.Scenario{}, nil, nil, nil, err
	}
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = st.Experts / c.GPUs()
	}
	return sc, plan, rep0, slots, nil
}

// runChain is the chain experiment: the chain-flow search from EPLB's
// plan.
func runChain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("chain", stderr).withLimit(45*time.Second, "the search's time limit")
	shares := f.fs.String("shares", "", "p,x: the proxy's and the exact counters' shares of the limit (default 0.6,0.3)")
	if err := f.parse(args); err != nil {
		return err
	}
	var cs affinity.ChainShares
	if *shares != "" {
		var err error
		if cs, err = parseShares(*shares); err != nil {
			return usageError{err}
		}
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	p := &lineWriter{w: stdout}
	sc, plan, rep0, slots, err := chainSetup(st, f.nodes)
	if err != nil {
		return err
	}
	c := sc.Cluster
	if *shares != "" {
		p.printf("shares: proxy %g, exact %g", cs.Proxy, cs.Exact)
	}
	res, err := affinity.SolveChain(ctx, affinity.Problem{Scenario: sc, Slots: slots, Start: plan}, affinity.Options{Limit: task.Limit{Deadline: time.Now().Add(f.limit)}, Parallel: 2, Chain: cs})
	if err != nil {
		return err
	}
	out := placement.FromReplicas(c.GPUs(), res.Copies, "affinity")
	rep1, err := sc.Evaluate(out)
	if err != nil {
		return err
	}
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
			if out, in, mean := affinity.NICPorts(lr.Dispatch, c.GPUsPerNode); mean > 0 {
				so += slices.Max(out) / mean
				si += slices.Max(in) / mean
			}
		}
		nl := float64(len(r.Layers))
		p.printf("%s: compute %v, all-to-all %v, NIC ports' busiest/mean out %.4f, in %.4f", []string{"start", "plan"}[i], r.ComputeTail, r.CommTime, so/nl, si/nl)
	}
	p.printf("cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f, worst %.4f → %.4f", rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanBalance, rep1.MeanBalance, worst(rep0), worst(rep1))
	return nil
}

// parseShares reads -shares p,x.
func parseShares(v string) (affinity.ChainShares, error) {
	ps, xs, ok := strings.Cut(v, ",")
	p, err1 := strconv.ParseFloat(strings.TrimSpace(ps), 64)
	x, err2 := strconv.ParseFloat(strings.TrimSpace(xs), 64)
	if !ok || err1 != nil || err2 != nil || !(p > 0 && p < 1 && x > 0 && x <= 1-p) {
		return affinity.ChainShares{}, fmt.Errorf("-shares %q: want p,x with 0 < p < 1 and 0 < x ≤ 1 − p (the proxy's and the exact counters' shares)", v)
	}
	return affinity.ChainShares{Proxy: p, Exact: x}, nil
}

// runChainCeiling is the chain-ceiling experiment (affinity.ChainCeiling
// from EPLB's plan).
func runChainCeiling(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("chain-ceiling", stderr).withLimit(240*time.Second, "the annealing's time limit")
	capx := f.fs.Float64("capx", 0, "let every layer's compute tail rise to capx times its mean GPU's where that is above EPLB's tail; 0: EPLB's tail")
	if err := f.parse(args); err != nil {
		return err
	}
	if *capx < 0 {
		return usageError{fmt.Errorf("-capx %v: need 0 (EPLB's tail) or more", *capx)}
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	sc, plan, rep0, slots, err := chainSetup(st, f.nodes)
	if err != nil {
		return err
	}
	copies, n, err := affinity.ChainCeiling(ctx, affinity.Problem{Scenario: sc, Slots: slots, Start: plan}, *capx, task.Limit{Deadline: time.Now().Add(f.limit)})
	if err != nil {
		return err
	}
	rep1, err := sc.Evaluate(placement.FromReplicas(sc.Cluster.GPUs(), copies, "ceiling"))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d swaps; cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f, worst %.4f → %.4f\n", n, rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanBalance, rep1.MeanBalance, rep0.MaxBalance, rep1.MaxBalance)
	return nil
}
