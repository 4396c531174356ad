package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// proxyCopies is every layer's copies of cp.
func proxyCopies(cp *chainProxy) [][][]int32 {
	c := make([][][]int32, cp.L)
	for l := range c {
		c[l] = cp.copies(l)
	}
	return c
}

// kindsOf is nodeKinds for sc's cluster and slots.
func kindsOf(sc costmodel.Scenario, slots []int) []int {
	c := sc.Cluster
	speed := make([]float64, c.GPUs())
	for g := range speed {
		speed[g] = c.SpeedOf(g)
	}
	return nodeKinds(slots, speed, c.Nodes, c.GPUsPerNode)
}

// TestRelabelSavesWhatItSays: on random chain instances (copies or not,
// homes or not, nodes of different speeds) relabel lowers the proxy's cut
// by exactly what it returns, never raises it, moves copies only between
// GPUs of the same speed and slots, keeps every GPU's load (as a
// multiset per layer and per kind of node), and leaves counters equal to a
// proxy built afresh from its copies.
func TestRelabelSavesWhatItSays(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 17))
	saved, kept := 0, 0
	for it := range 24 {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E, K := 2*N*P+rng.IntN(8), 1+rng.IntN(3)
		red := 0
		if it%3 == 1 {
			red = N * P
		}
		red = fillSlots(E, N*P, red)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 2+rng.IntN(4), 40+rng.IntN(80), red, placement.DispatchEven, it%2 == 0)
		sc.Flow = costmodel.FlowChain
		if it%4 == 3 {
			// Node 0 faster: it is alike to no other node.
			sc.Cluster.Speed = make([]float64, N*P)
			for g := range sc.Cluster.Speed {
				sc.Cluster.Speed[g] = 1
				if g < P {
					sc.Cluster.Speed[g] = 1.5
				}
			}
		}
		kind := kindsOf(sc, slots)
		cp, w := chainProxyOf(t, sc, plan)
		for l := range cp.floor {
			cp.floor[l] = 1 + rng.Float64()/4
		}
		before := cp.cost()
		// loads[l][kind]: the GPUs' loads on nodes of that kind, sorted.
		loads := func() []map[int][]float64 {
			out := make([]map[int][]float64, cp.L)
			for l := range out {
				out[l] = map[int][]float64{}
				for g, v := range cp.gload[l] {
					out[l][kind[g/P]] = append(out[l][kind[g/P]], v)
				}
				for _, vs := range out[l] {
					slices.Sort(vs)
				}
			}
			return out
		}
		type at struct{ l, e int }
		speedOf := map[at][]float64{}
		for l := range cp.L {
			for x, e := range cp.exp[l] {
				k := at{l, int(e)}
				speedOf[k] = append(speedOf[k], sc.Cluster.SpeedOf(cp.gpu[l][x]))
			}
		}
		l0 := loads()
		s := cp.relabel(kind)
		after := cp.cost()
		require.GreaterOrEqual(t, s, 0.0, "instance %d", it)
		require.InDelta(t, before-after, s, 1e-9*max(1, before), "instance %d: cut %.9g → %.9g", it, before, after)
		if s > 0 {
			saved++
		} else {
			kept++
		}
		l1 := loads()
		for l := range l0 {
			require.Len(t, l1[l], len(l0[l]))
			for k, vs := range l0[l] {
				require.InDeltaSlice(t, vs, l1[l][k], 1e-9, "instance %d layer %d: GPU loads on nodes of kind %d", it, l, k)
			}
		}
		for l := range cp.L {
			for x, e := range cp.exp[l] {
				require.Contains(t, speedOf[at{l, int(e)}], sc.Cluster.SpeedOf(cp.gpu[l][x]), "instance %d: expert %d moved to a GPU of another speed", it, e)
			}
		}
		copies := proxyCopies(cp)
		checkPlan(t, toGPUs(copies), E, slots)
		fresh := newChainProxy(Problem{Scenario: sc}, copies, w)
		for l := range cp.L {
			require.InDeltaSlice(t, fresh.c[l], cp.c[l], 1e-9, "instance %d layer %d: partner counters", it, l)
			require.InDeltaSlice(t, fresh.nload[l], cp.nload[l], 1e-9)
			if cg := cp.cgOf(l); cg != nil {
				require.InDeltaSlice(t, fresh.cg[l], cg, 1e-9, "instance %d layer %d: sender counters", it, l)
			}
			if cp.dtok != nil && cp.dtok[l] != nil {
				require.InDeltaSlice(t, fresh.dtok[l], cp.dtok[l], 1e-6)
			}
		}
		require.InDelta(t, fresh.cost(), after, 1e-9*max(1, after))
	}
	require.Positive(t, saved, "no instance had anything to relabel")
	t.Logf("%d instances relabelled, %d kept", saved, kept)
}

func toGPUs(c [][][]int32) [][][]placement.GPU {
	out := make([][][]placement.GPU, len(c))
	for l := range c {
		out[l] = gpuCopiesOf(c[l])
	}
	return out
}

// permutations calls fn with every permutation of 0..n−1.
func permutations(n int, fn func([]int)) {
	p := make([]int, n)
	used := make([]bool, n)
	var rec func(i int)
	rec = func(i int) {
		if i == n {
			fn(p)
			return
		}
		for v := range n {
			if !used[v] {
				used[v], p[i] = true, v
				rec(i + 1)
				used[v] = false
			}
		}
	}
	rec(0)
}

// TestRelabelBruteForce: without homes the cut between layers depends on
// the nodes' labels only through adjacent layers, and relabel reaches the
// least cut over every relabelling of every layer (3 nodes, up to 3
// layers: (3!)^3 relabellings); with homes it is never above the start
// and, for one layer, optimal too.
func TestRelabelBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 3))
	gained := 0
	for it := range 20 {
		N, P := 3, 1+rng.IntN(2)
		E, K := 2*N*P+rng.IntN(4), 1+rng.IntN(3)
		L := 1 + rng.IntN(3)
		homes := it%2 == 1
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, L, 30+rng.IntN(40), fillSlots(E, N*P, 0), placement.DispatchEven, false)
		sc.Flow = costmodel.FlowChain
		kind := kindsOf(sc, slots)
		t.Run(fmt.Sprintf("%d-P%dE%dL%d-homes%v", it, P, E, L, homes), func(t *testing.T) {
			build := func() *chainProxy {
				cp, _ := chainProxyOf(t, sc, plan)
				if !homes {
					cp.term = make([][]float64, cp.L)
				}
				return cp
			}
			cp := build()
			start := cp.cost()
			best := math.Inf(1)
			var rec func(l int, lams [][]int)
			rec = func(l int, lams [][]int) {
				if l == L {
					q := build()
					for m, lam := range lams {
						q.moveNodes(m, lam)
					}
					for m := range q.L {
						q.fillC(m)
					}
					best = min(best, q.cost())
					return
				}
				permutations(N, func(p []int) {
					rec(l+1, append(lams, slices.Clone(p)))
				})
			}
			rec(0, nil)
			cp.relabel(kind)
			got := cp.cost()
			require.LessOrEqual(t, got, start*(1+1e-12))
			require.GreaterOrEqual(t, got, best*(1-1e-12)-1e-12)
			if !homes || L == 1 {
				require.InDelta(t, best, got, 1e-9*max(1, best), "relabelled cut %.9g, least %.9g (start %.9g)", got, best, start)
			}
			if got < start*(1-1e-9) {
				gained++
			}
		})
	}
	require.Positive(t, gained, "no instance gained from relabelling")
}

// TestSolveChainFindsPersistentBlocks: on planted traces (blocks of experts
// that persist over 12 layers, 4 nodes, 3,000 tokens) the chain search
// from random balanced plans comes, on average over eight traces, within
// 1.5 % of the planted plan's modeled time and 60 % of its cross-node
// transitions. Without the relabelling (a run of layers that lines up
// differently from the layers before it stays cut at its edge) it was
// 2.4 % slower and had 89 % more transitions (four traces). Four traces
// left the mean time's ratio within a draw of the bound: 1.0113 to 1.0154
// over four builds whose searches differ only in their random draws and
// work units; eight give 1.0132 to 1.0140 for three of them.
func TestSolveChainFindsPersistentBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 7))
	const n = 8
	var timeRatio, transRatio float64
	for it := range n {
		N, P, S, L, K := 4, 2, 4, 12, 2
		tr, planted := testkit.Planted{Nodes: N, GPUsPerNode: P, SlotsPerGPU: S, Layers: L, TopK: K, Tokens: 3000, Stray: 10}.Trace(rng)
		require.NoError(t, tr.Validate())
		E := N * P * S
		sc := costmodel.Scenario{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(N, P), Model: testkit.FakeModel(E, K), Flow: costmodel.FlowChain, Dispatch: placement.DispatchEven}
		slots := slices.Repeat([]int{S}, N*P)
		copies := make([][][]placement.GPU, L)
		for l := range copies {
			copies[l] = randomCopies(rng, E, N*P, S)
		}
		start := placement.FromReplicas(N*P, copies, "rand")
		res, err := SolveChain(context.Background(), Problem{Scenario: sc, Slots: slots, Start: start}, Options{Limit: task.Limit{Work: 20000}})
		require.NoError(t, err)
		checkPlan(t, res.Copies, E, slots)
		score := func(p *placement.Plan) (trans, sec float64) {
			rep, err := sc.Evaluate(p)
			require.NoError(t, err)
			for _, lr := range rep.Layers[1:] {
				trans += lr.RemoteCopies
			}
			return trans, rep.TimeSec
		}
		gt, gs := score(placement.FromReplicas(N*P, res.Copies, "affinity"))
		pt, ps := score(planted)
		st, ss := score(start)
		t.Logf("instance %d: transitions and time: start %.0f %.6g s, search %.0f %.6g s, planted %.0f %.6g s", it, st, ss, gt, gs, pt, ps)
		timeRatio += gs / ps / n
		transRatio += gt / pt / n
	}
	t.Logf("mean over %d traces: time %.5f, transitions %.4f of the planted plan's", n, timeRatio, transRatio)
	require.LessOrEqual(t, timeRatio, 1.015, "the search's plans are modeled slower than the planted plans")
	require.LessOrEqual(t, transRatio, 1.6, "the search's plans have more cross-node transitions than the planted plans")
}
