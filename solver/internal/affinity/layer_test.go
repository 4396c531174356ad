package affinity

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// randomInstance is a small home-flow instance with per-token paths: tokens
// prefer the experts of one of a few classes, and come from sources that
// prefer some classes (so that placement matters), with some tokens
// without a source when noSource is set.
func randomInstance(t *testing.T, rng *rand.Rand, N, P, E, K, L, T, red int, d placement.Dispatch, noSource bool) (costmodel.Scenario, *placement.Plan, []int) {
	t.Helper()
	sc, plan, slots, _ := randomTraceInstance(t, rng, N, P, E, K, L, T, red, d, noSource)
	return sc, plan, slots
}

// randomTraceInstance is randomInstance with the trace its statistics
// count.
func randomTraceInstance(t *testing.T, rng *rand.Rand, N, P, E, K, L, T, red int, d placement.Dispatch, noSource bool) (costmodel.Scenario, *placement.Plan, []int, *routing.Trace) {
	t.Helper()
	G := N * P
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
	classes := 1 + rng.IntN(4)
	for tok := range T {
		h := rng.IntN(G)
		tr.Source[tok] = int32(h)
		if noSource && rng.IntN(3) == 0 {
			tr.Source[tok] = -1
		}
		c := (h + rng.IntN(2)) % classes
		for range L {
			var pick []int
			for len(pick) < K {
				e := rng.IntN(E)
				if rng.IntN(10) < 6 {
					e = (e/classes)*classes + c
					e %= E
				}
				if !slices.Contains(pick, e) {
					pick = append(pick, e)
				}
			}
			for _, e := range pick {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
	}
	require.NoError(t, tr.Validate())
	st := tr.Stats(routing.StatsOptions{})
	m := testkit.FakeModel(E, K)
	sc := costmodel.Scenario{Stats: st, Cluster: testkit.SmallCluster(N, P), Model: m, Flow: costmodel.FlowHome, Dispatch: d}
	if rng.IntN(2) == 0 {
		sc.Mode = costmodel.Overlapped
	}
	S := (E + red) / G
	slots := make([]int, G)
	for g := range slots {
		slots[g] = S
	}
	copies := make([][][]placement.GPU, L)
	for l := range copies {
		copies[l] = randomCopies(rng, E, G, S)
	}
	return sc, placement.FromReplicas(G, copies, "rand"), slots, tr
}

// randomCopies gives every expert one copy and the spare slots to random
// experts, on distinct GPUs with S slots each.
func randomCopies(rng *rand.Rand, E, G, S int) [][]placement.GPU {
	for {
		free := make([]int, G)
		for g := range free {
			free[g] = S
		}
		cp := make([][]placement.GPU, E)
		ok := true
		put := func(e int) {
			var opts []int
			for g := range G {
				if free[g] > 0 && !slices.Contains(cp[e], placement.GPU(g)) {
					opts = append(opts, g)
				}
			}
			if len(opts) == 0 {
				ok = false
				return
			}
			g := opts[rng.IntN(len(opts))]
			free[g]--
			cp[e] = append(cp[e], placement.GPU(g))
		}
		for _, e := range rng.Perm(E) {
			put(e)
		}
		for i := 0; i < G*S-E && ok; i++ {
			put(rng.IntN(E))
		}
		if ok {
			return cp
		}
	}
}

// randomMove returns a random valid move of s.
func randomMove(rng *rand.Rand, s *state) (move, bool) {
	for range 100 {
		G := len(s.held)
		a := rng.IntN(G)
		if len(s.held[a]) == 0 {
			continue
		}
		mv := move{kind: moveSwap, a: a, ia: rng.IntN(len(s.held[a])), b: rng.IntN(G)}
		if rng.IntN(3) == 0 {
			mv.kind, mv.f = moveRetarget, rng.IntN(len(s.cs))
		} else if len(s.held[mv.b]) > 0 {
			mv.ib = rng.IntN(len(s.held[mv.b]))
		}
		if s.valid(mv) {
			return mv, true
		}
	}
	return move{}, false
}

// TestCountersMatchCostModel: the state's NIC ports, remote-node copies
// and GPU tokens are the cost model's (its dispatch matrix, per source and
// destination GPU) for the same plan, before and after random moves, and
// every tried delta is the applied change. It catches a wrong factor
// update (replicated experts, static and local dispatch, tokens with both
// experts of a swap), a move applied to the wrong slot, and a delta that
// drifts from the state.
func TestCountersMatchCostModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	for it := range 40 {
		N, P := 2+rng.IntN(2), 1+rng.IntN(3)
		E, K := 6+rng.IntN(10), 1+rng.IntN(3)
		red := rng.IntN(3) * N * P
		if E+red < N*P {
			red = N * P
		}
		for (E+red)%(N*P) != 0 {
			red++
		}
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}[it%3]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%dR%d", it, d, N, P, E, K, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 2, 60+rng.IntN(100), red, d, false)
			sh, err := newShape(Problem{Scenario: sc, Slots: slots, Start: plan})
			require.NoError(t, err)
			// Count the NVLink ports whether or not they matter here.
			sh.nv = sh.nvSec > 0
			for l := range 2 {
				ly := buildLayer(Problem{Scenario: sc, Slots: slots}, sh, l)
				s := newState(ly, int32Copies(plan.ExpertGPUs(l)))
				checkAgainstModel(t, sc, s, l)
				for range 60 {
					if !tryApply(t, rng, s) {
						break
					}
				}
				checkAgainstModel(t, sc, s, l)
			}
		})
	}
}

// checkAgainstModel compares s (layer l) with the cost model's report of
// the plan s holds (every other layer from the same copies).
func checkAgainstModel(t *testing.T, sc costmodel.Scenario, s *state, l int) {
	t.Helper()
	sh := s.ly.sh
	G, P := sh.G, sh.P
	cp := make([][][]placement.GPU, sc.Stats.Layers)
	for i := range cp {
		cp[i] = make([][]placement.GPU, sh.E)
		for e, gs := range s.copies() {
			for _, g := range gs {
				cp[i][e] = append(cp[i][e], placement.GPU(g))
			}
		}
	}
	rep, err := sc.Evaluate(placement.FromReplicas(G, cp, "s"))
	require.NoError(t, err)
	lr := rep.Layers[l]
	tb := sc.Model.TokenBytes()
	for g := 0; g < G; g++ {
		assert.InDelta(t, lr.Tokens[g], s.tok[g], 1e-9*math.Max(1, lr.Tokens[g]), "tokens of GPU %d", g)
		out, in := 0.0, 0.0
		for d := 0; d < G; d++ {
			if d/P != g/P {
				out += lr.Dispatch[g][d]
				in += lr.Dispatch[d][g]
			}
		}
		// The model's NIC row of g also carries the copies g forwards;
		// only the first hop (g's own tokens) is counted in out, so
		// compare the NIC bytes g sends to other nodes' same-index GPUs.
		assert.InDelta(t, out/tb, s.out[g], 1e-6*math.Max(1, out/tb), "NIC out of GPU %d", g)
		assert.InDelta(t, in/tb, s.in[g], 1e-6*math.Max(1, in/tb), "NIC in of GPU %d", g)
	}
	assert.InDelta(t, lr.CrossNodeBytes/2/tb, s.remote(), 1e-6*math.Max(1, s.remote()))
	if sh.nv {
		// The NVLink ports of the dispatch, forwarding included.
		for g := 0; g < G; g++ {
			out, in := 0.0, 0.0
			for d := 0; d < G; d++ {
				if d/P == g/P {
					out += lr.Dispatch[g][d]
					in += lr.Dispatch[d][g]
				}
			}
			assert.InDelta(t, out/tb, s.nvOut[g], 1e-6*math.Max(1, out/tb), "NVLink out of GPU %d", g)
			assert.InDelta(t, in/tb, s.nvIn[g], 1e-6*math.Max(1, in/tb), "NVLink in of GPU %d", g)
		}
	}
	// The incremental counters equal a fresh computation.
	z, pr := slices.Clone(s.z), slices.Clone(s.pr)
	out, in, tok := slices.Clone(s.out), slices.Clone(s.in), slices.Clone(s.tok)
	zg, pg := slices.Clone(s.zg), slices.Clone(s.pg)
	nvo, nvi := slices.Clone(s.nvOut), slices.Clone(s.nvIn)
	s.resync()
	assert.Equal(t, z, s.z)
	assert.Equal(t, zg, s.zg)
	for _, c := range []struct {
		what      string
		kept, now []float64
	}{{"pr", pr, s.pr}, {"pg", pg, s.pg}, {"NIC out", out, s.out}, {"NIC in", in, s.in}, {"tokens", tok, s.tok}, {"NVLink out", nvo, s.nvOut}, {"NVLink in", nvi, s.nvIn}} {
		require.Len(t, c.now, len(c.kept), c.what)
		for i, v := range c.kept {
			require.InDelta(t, v, c.now[i], 1e-9*math.Max(1, v), "%s %d: incremental against fresh", c.what, i)
		}
	}
}

// tryApply makes a random valid move of s, scored at a random level, and
// fails unless the tried change of the cost and of the remote-node copies
// is what applying it changes; false when no valid move was found.
func tryApply(t *testing.T, rng *rand.Rand, s *state) bool {
	t.Helper()
	mv, ok := randomMove(rng, s)
	if !ok {
		return false
	}
	lv := level(rng.IntN(2))
	before := s.costNow(lv)
	dlt := s.try(mv, lv)
	dR := s.tr.dR
	r0 := s.remote()
	s.apply(mv)
	require.InDelta(t, before+dlt, s.costNow(lv), 1e-12*math.Max(1, before), "move %+v", mv)
	require.InDelta(t, r0+dR, s.remote(), 1e-9*math.Max(1, r0), "move %+v", mv)
	return true
}

// fillSlots is the least number of redundant slots, at least red, that
// makes E+red a positive multiple of G (every GPU the same slot count).
func fillSlots(E, G, red int) int {
	for (E+red)%G != 0 || E+red < G {
		red++
	}
	return red
}
