package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// runHome is the home experiment: EPLB's plan with 8 redundant slots per
// node (FixDuplicates, SGLang's static dispatch) against the affinity
// search from it.
func runHome(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("home", stderr).withLimit(20*time.Second, "the search's time limit")
	capR := f.fs.Float64("cap", 0, "the search's MaxImbalance (busiest/mean per unit of GPU speed); 0: none")
	if err := f.parse(args); err != nil {
		return err
	}
	if *capR < 0 {
		return usageError{fmt.Errorf("-cap %v: need 0 (none) or more", *capR)}
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	p := &lineWriter{w: stdout}
	nodes := f.nodes
	red := 32 * nodes / 4
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes = nodes
	m, _ := costmodel.ModelPreset("deepseek-v3")
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: red, Nodes: nodes, FixDuplicates: true})
	if err != nil {
		return err
	}
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchStaticMean}
	r0, rep0, err := remotePerTokenLayer(sc, plan)
	if err != nil {
		return err
	}
	p.printf("eplb: remote %.4f time %.3fms imb %.4f", r0, rep0.TimeSec*1e3, rep0.MeanBalance)
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = (st.Experts + red) / c.GPUs()
	}
	t0 := time.Now()
	res, err := affinity.Solve(ctx, affinity.Problem{Scenario: sc, Slots: slots, Start: plan, MaxImbalance: *capR}, affinity.Options{
		Limit:    task.Limit{Deadline: time.Now().Add(f.limit)},
		Parallel: 2,
		Shares:   affinity.Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15},
		Logf:     p.printf,
	})
	if err != nil {
		return err
	}
	el := time.Since(t0)
	out := placement.FromReplicas(c.GPUs(), res.Copies, "affinity")
	if err := out.Validate(placement.ValidateOptions{EqualSlots: true}); err != nil {
		return err
	}
	r1, rep1, err := remotePerTokenLayer(sc, out)
	if err != nil {
		return err
	}
	worst := 0.0
	for _, lr := range rep1.Layers {
		worst = max(worst, lr.Balance)
	}
	for _, l := range []int{0, 1, 2} {
		if l >= st.Layers {
			break
		}
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
			p.printf("layer %d plan %d: tail %v disp %v comb %v; NIC max/mean %.4f; NIC max %.3gB NV max %.3gB", l, i, lr.ComputeTail, lr.DispatchTime, lr.CombineTime, mx/(tot/float64(len(lr.Dispatch))), mx, nv)
		}
	}
	p.printf("affinity: remote %.4f (%.2f%%) time %.3fms (%.2f%%) imb %.4f worst %.4f tries %d in %v", r1, (r1/r0-1)*100, rep1.TimeSec*1e3, (rep1.TimeSec/rep0.TimeSec-1)*100, rep1.MeanBalance, worst, res.Tries, el)
	for i, rep := range []*costmodel.Report{rep0, rep1} {
		ex, ports, most := busiestPorts(rep, c.GPUsPerNode)
		p.printf("plan %d: busiest NIC port over the mean %.4f (mean over layers); %d ports are the busiest in some layer, none in more than %d", i, ex, ports, most)
	}
	return nil
}

// remotePerTokenLayer is plan's remote copies per token and layer (half
// a layer's cross-node bytes, dispatch and combine, in token bytes) and
// its report.
func remotePerTokenLayer(sc costmodel.Scenario, plan *placement.Plan) (float64, *costmodel.Report, error) {
	rep, err := sc.Evaluate(plan)
	if err != nil {
		return 0, nil, err
	}
	nic := 0.0
	for _, lr := range rep.Layers {
		nic += lr.CrossNodeBytes
	}
	return nic / 2 / sc.Model.TokenBytes() / sc.Stats.Tokens / float64(sc.Stats.Layers), rep, nil
}

// busiestPorts returns a report's busiest NIC port (out or in, the
// dispatch's) over the mean port, averaged over the layers; how many
// ports are the busiest in some layer; and in how many layers, at most,
// one port is the busiest.
func busiestPorts(rep *costmodel.Report, P int) (excess float64, ports, most int) {
	hot := map[int]int{}
	for _, lr := range rep.Layers {
		out, in, mean := affinity.NICPorts(lr.Dispatch, P)
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
