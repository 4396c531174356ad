package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
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
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchStatic}
	r0, rep0 := remotePerTokenLayer(t, sc, plan)
	t.Logf("eplb: remote %.4f time %.3fms imb %.4f", r0, rep0.TimeSec*1e3, rep0.MeanImbalance)
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
	res, err := Solve(context.Background(), Problem{Scenario: sc, Slots: slots, Start: plan}, Options{Limit: task.Limit{Deadline: time.Now().Add(lim)}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}})
	require.NoError(t, err)
	el := time.Since(t0)
	out := placement.FromReplicas(c.GPUs(), res.Copies, "affinity")
	require.NoError(t, out.Validate(placement.ValidateOptions{EqualSlots: true}))
	r1, rep1 := remotePerTokenLayer(t, sc, out)
	worst := 0.0
	for _, lr := range rep1.Layers {
		worst = max(worst, lr.Imbalance)
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
	t.Logf("affinity: remote %.4f (%.2f%%) time %.3fms (%.2f%%) imb %.4f worst %.4f tries %d in %v", r1, (r1/r0-1)*100, rep1.TimeSec*1e3, (rep1.TimeSec/rep0.TimeSec-1)*100, rep1.MeanImbalance, worst, res.Tries, el)
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
			w = max(w, lr.Imbalance)
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
	t.Logf("cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f, worst %.4f → %.4f", rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanImbalance, rep1.MeanImbalance, worst(rep0), worst(rep1))
}

// TestExperimentNodeCeiling asks how far any placement could go on a
// trace: a plain simulated annealing on the exact count (distinct remote
// nodes per token, homes from the sources), one copy per expert, swaps of
// two experts between nodes, every node's tokens held under a hard cap of
// cap × the mean. Loose caps show what balance costs. It starts from
// EPLB's nodes (first copies) and reports the change against EPLB's count
// with the same copies; NODES, LIMIT (per run) and TRACE as the other
// experiments, LAYERS the layers (default 0,1,2).
func TestExperimentNodeCeiling(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment")
	}
	src, err := routing.Load(expTrace(), routing.LoadOptions{})
	require.NoError(t, err)
	st := src.Stats
	N, _ := strconv.Atoi(os.Getenv("NODES"))
	if N == 0 {
		N = 4
	}
	const P = 8
	G := N * P
	lim, _ := time.ParseDuration(os.Getenv("LIMIT"))
	if lim == 0 {
		lim = 20 * time.Second
	}
	layers := []int{0, 1, 2}
	if v := os.Getenv("LAYERS"); v != "" {
		layers = layers[:0]
		for _, f := range strings.Split(v, ",") {
			l, err := strconv.Atoi(f)
			require.NoError(t, err)
			layers = append(layers, l)
		}
	}
	plan, err := baseline.EPLB(st, G, baseline.EPLBOptions{Nodes: N})
	require.NoError(t, err)
	E, K, T := st.Experts, st.TopK, len(st.Patterns)
	home := make([]int, T)
	w := make([]float64, T)
	for i, pt := range st.Patterns {
		w[i] = pt.Count
		home[i] = i % G / P
		if pt.Source >= 0 {
			home[i] = int(pt.Source) % G / P
		}
	}
	for _, l := range layers {
		tok := make([][]int32, E)
		load := make([]float64, E)
		for i, pt := range st.Patterns {
			for _, e := range pt.Experts[l*K : (l+1)*K] {
				tok[e] = append(tok[e], int32(i))
				load[e] += pt.Count
			}
		}
		start := make([]int, E)
		for e, gs := range plan.ExpertGPUs(l) {
			start[e] = int(gs[0]) / P
		}
		mean := 0.0
		for _, v := range load {
			mean += v / float64(N)
		}
		for _, capf := range []float64{1.01, 1.02, 1.10, math.Inf(1)} {
			node := slices.Clone(start)
			nl := make([]float64, N)
			cnt := make([]uint8, T*N)
			for e, b := range node {
				nl[b] += load[e]
				for _, i := range tok[e] {
					cnt[int(i)*N+b]++
				}
			}
			remote := 0.0
			for i := 0; i < T; i++ {
				for b := 0; b < N; b++ {
					if cnt[i*N+b] > 0 && b != home[i] {
						remote += w[i]
					}
				}
			}
			r0 := remote
			// mv moves e to node b and returns the change of the count.
			mv := func(e, b int) float64 {
				a, d := node[e], 0.0
				for _, i32 := range tok[e] {
					i := int(i32)
					cnt[i*N+a]--
					if cnt[i*N+a] == 0 && a != home[i] {
						d -= w[i]
					}
					if cnt[i*N+b] == 0 && b != home[i] {
						d += w[i]
					}
					cnt[i*N+b]++
				}
				node[e] = b
				return d
			}
			over := func() float64 {
				o := 0.0
				for _, v := range nl {
					o += max(0, v-capf*mean)
				}
				return o
			}
			rng := rand.New(rand.NewPCG(uint64(l), 7))
			// Hot temperature: the mean |Δ| of random swaps; cooled over
			// three decades.
			t0, n0 := 0.0, 0
			for range 4 * E {
				e, f := rng.IntN(E), rng.IntN(E)
				a, b := node[e], node[f]
				if a == b {
					continue
				}
				d := mv(e, b) + mv(f, a)
				mv(e, a)
				mv(f, b)
				t0 += math.Abs(d)
				n0++
			}
			t0 /= float64(max(n0, 1))
			best := math.Inf(1)
			if over() == 0 {
				best = remote
			}
			begin := time.Now()
			for time.Since(begin) < lim {
				p := time.Since(begin).Seconds() / lim.Seconds()
				temp := t0 * math.Pow(1e-3, p)
				for range 256 {
					e, f := rng.IntN(E), rng.IntN(E)
					a, b := node[e], node[f]
					if a == b {
						continue
					}
					o0 := over()
					nl[a] += load[f] - load[e]
					nl[b] += load[e] - load[f]
					if o1 := over(); o1 > 0 && o1 >= o0 {
						nl[a] -= load[f] - load[e]
						nl[b] -= load[e] - load[f]
						continue
					}
					d := mv(e, b) + mv(f, a)
					if d <= 0 || rng.Float64() < math.Exp(-d/temp) {
						remote += d
						if remote < best && over() == 0 {
							best = remote
						}
						continue
					}
					mv(e, a)
					mv(f, b)
					nl[a] -= load[f] - load[e]
					nl[b] -= load[e] - load[f]
				}
			}
			imb := 0.0
			for _, v := range nl {
				imb = max(imb, v/mean)
			}
			t.Logf("layer %d cap %.2f: EPLB %.4f → %.4f remote nodes per token (%+.2f%%), node busiest/mean %.4f", l, capf, r0/st.Tokens, best/st.Tokens, (best/r0-1)*100, imb)
		}
	}
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
	for l := range tcap {
		tcap[l] = cx.tail(l, -1, -1, 0) * (1 + 1e-12)
	}
	cx.tie = 1e6 // the copies alone
	lim, _ := time.ParseDuration(os.Getenv("LIMIT"))
	dl := time.Now().Add(lim)
	scs := []*schedule{newSchedule(t.Context(), task.Limit{Deadline: dl}, 1), newSchedule(t.Context(), task.Limit{Deadline: dl}, 1)}
	gpu, n := cx.anneal(1, scs, func(float64) bool { return true })
	rep1, err := sc.Evaluate(placement.FromReplicas(c.GPUs(), gpuCopies(gpu), "ceiling"))
	require.NoError(t, err)
	t.Logf("%d swaps; cross-node %.4g → %.4g (%.2f%%), time %.4g → %.4g (%.2f%%), imbalance %.4f → %.4f", n, rep0.CrossNodeBytes, rep1.CrossNodeBytes, (rep1.CrossNodeBytes/rep0.CrossNodeBytes-1)*100, rep0.TimeSec, rep1.TimeSec, (rep1.TimeSec/rep0.TimeSec-1)*100, rep0.MeanImbalance, rep1.MeanImbalance)
}
