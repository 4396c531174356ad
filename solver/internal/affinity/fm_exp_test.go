package affinity

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestExperimentFM compares, layer by layer on one core, the home flow's
// phases with the node-level swaps priced afresh (the old node phase) and
// with the gain-cached refinement, each layer given PER (default 60ms;
// several comma-separated), from EPLB's plan (4 × 8, 32 redundant slots,
// DISPATCH, default static-mean). It prints the remote-node copies per
// token and the surrogate layer time against the start. LAYERS, NODES and
// TRACE as the other experiments.
func TestExperimentFM(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	nodes, layers := testkit.ExpSettings(t, 0, 10, 20, 30, 40, 50)
	src, err := routing.Load(expTrace(), routing.LoadOptions{})
	require.NoError(t, err)
	st := src.Stats
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes = nodes
	m, _ := costmodel.ModelPreset("deepseek-v3")
	red := 32 * nodes / 4
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: red, Nodes: nodes, FixDuplicates: true})
	require.NoError(t, err)
	d := placement.DispatchStaticMean
	if v := os.Getenv("DISPATCH"); v != "" {
		d, err = placement.ParseDispatch(v)
		require.NoError(t, err)
	}
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: d}
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = (st.Experts + red) / c.GPUs()
	}
	p := Problem{Scenario: sc, Slots: slots, Start: plan}
	sh, err := newShape(p)
	require.NoError(t, err)
	pers := []time.Duration{60 * time.Millisecond}
	if v := os.Getenv("PER"); v != "" {
		pers = nil
		for _, f := range strings.Split(v, ",") {
			dd, err := time.ParseDuration(f)
			require.NoError(t, err)
			pers = append(pers, dd)
		}
	}
	type variant struct {
		name string
		sh   Shares
	}
	variants := []variant{
		{"old", Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15, swapNodes: true}},
		{"fm", Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}},
		{"fm-noproxy", Shares{Nodes: 0.5, GPUs: 0.15}},
		{"fm2", Shares{Proxy: 0.25, Nodes: 0.4, GPUs: 0.15}},
		{"fm3", Shares{Proxy: 0.15, Nodes: 0.5, GPUs: 0.15}},
	}
	if v := os.Getenv("VARIANTS"); v != "" {
		var keep []variant
		for _, x := range variants {
			if strings.Contains(","+v+",", ","+x.name+",") {
				keep = append(keep, x)
			}
		}
		variants = keep
	}
	for _, per := range pers {
		for _, v := range variants {
			var r0, r1, c0, c1, imb float64
			t0 := time.Now()
			for _, l := range layers {
				ly := buildLayer(p, sh, l)
				s := newState(ly, int32Copies(plan.ExpertGPUs(l)))
				r0 += s.remote()
				c0 += newStateKappa(ly, s.copies(), 0).costNow(levelGPU)
				out, _ := improve(context.Background(), s, task.Limit{Deadline: time.Now().Add(per)}, v.sh, uint64(l))
				r1 += out.remote()
				c1 += newStateKappa(ly, out.copies(), 0).costNow(levelGPU)
				imb += out.imbalance(levelGPU) / float64(len(layers))
			}
			n := st.Tokens * float64(len(layers))
			t.Logf("per %v %-10s: remote %.4f → %.4f (%+.2f%%), time %+.2f%%, imb %.4f, %v", per, v.name, r0/n, r1/n, (r1/r0-1)*100, (c1/c0-1)*100, imb, time.Since(t0).Round(time.Millisecond))
		}
	}
}

// TestExperimentFMConverge runs the refinement alone to convergence on
// each layer and prints what it found, its moves and its time.
func TestExperimentFMConverge(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	nodes, layers := testkit.ExpSettings(t, 0, 10, 20, 30, 40, 50)
	src, err := routing.Load(expTrace(), routing.LoadOptions{})
	require.NoError(t, err)
	st := src.Stats
	c, _ := costmodel.ClusterPreset("h100x8")
	c.Nodes = nodes
	m, _ := costmodel.ModelPreset("deepseek-v3")
	red := 32 * nodes / 4
	plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: red, Nodes: nodes, FixDuplicates: true})
	require.NoError(t, err)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchStaticMean}
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = (st.Experts + red) / c.GPUs()
	}
	p := Problem{Scenario: sc, Slots: slots, Start: plan}
	sh, err := newShape(p)
	require.NoError(t, err)
	for _, l := range layers {
		t0 := time.Now()
		ly := buildLayer(p, sh, l)
		s := newState(ly, int32Copies(plan.ExpertGPUs(l)))
		tb := time.Since(t0)
		se := &searcher{s: s, m: task.Limit{Deadline: time.Now().Add(time.Minute)}.Meter(context.Background()), nodeLevel: levelNode}
		r0 := s.remote()
		t1 := time.Now()
		f := newFM(se)
		f.first, _ = strconv.ParseFloat(os.Getenv("FIRST"), 64)
		if v := os.Getenv("STALL"); v != "" {
			f.stall, _ = strconv.Atoi(v)
		}
		tn := time.Since(t1)
		f.run()
		t.Logf("layer %d: build %v, gains %v, run %v: remote %.4f → %.4f (%+.2f%%), %d moves, %d passes, %d priced, node imb %.4f", l, tb.Round(time.Millisecond), tn.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), r0/st.Tokens, s.remote()/st.Tokens, (s.remote()/r0-1)*100, f.moves, f.passes, se.tries, s.imbalance(levelNode))
	}
}
