package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// fastDispatches are the dispatch models the fast paths are checked on:
// the even split, the expectation over SGLang's deals, the local rule and
// SGLang's dealt table.
var fastDispatches = []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal, placement.DispatchSGLangStatic}

// firstLayer is layer 0 of the home-flow search on sc from plan.
func firstLayer(t *testing.T, sc costmodel.Scenario, plan *placement.Plan, slots []int) *layer {
	t.Helper()
	p := Problem{Scenario: sc, Slots: slots, Start: plan}
	sh, err := newShape(p)
	require.NoError(t, err)
	return buildLayer(p, sh, 0)
}

// eachFastInstance runs f on n random one-layer instances (2-4 nodes of
// 1-3 GPUs, 8-17 experts, top-2 to 4, with or without spare slots, some
// tokens without a source), cycling through fastDispatches.
func eachFastInstance(t *testing.T, rng *rand.Rand, n int, f func(t *testing.T, it int, ly *layer, plan *placement.Plan)) {
	for it := range n {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E, K := 8+rng.IntN(10), 2+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%dR%d", it, d, N, P, E, K, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 80+rng.IntN(120), red, d, it%4 == 1)
			f(t, it, firstLayer(t, sc, plan, slots), plan)
		})
	}
}

// TestSingleRelocMatchesTrial: for every single-copy expert and every
// other node, the relocation gain read from the counters (singleReloc)
// equals the change of the remote-node copies a trial of that move
// counts token by token (tokenDeltas), before and after random moves. It
// fails if a token's home node is counted, if the node the expert leaves
// is not released where it was the token's only expert there, or if the
// sample weights are dropped.
func TestSingleRelocMatchesTrial(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 3))
	checked := 0
	eachFastInstance(t, rng, 16, func(t *testing.T, _ int, ly *layer, plan *placement.Plan) {
		N, P := ly.sh.N, ly.sh.P
		s := newState(ly, int32Copies(plan.ExpertGPUs(0)))
		dR := make([]float64, N)
		for round := range 3 {
			for e := range s.cs {
				if len(s.cs[e].gpus) != 1 {
					continue
				}
				a := int(s.cs[e].gpus[0])
				s.singleReloc(e, a/P, dR)
				for B := range N {
					if B == a/P {
						continue
					}
					s.setChange(&s.tr.ch[0], e, a, B*P)
					s.tr.nch = 1
					s.tr.valid = false
					s.tokenDeltas(false)
					require.InDelta(t, s.tr.dR, dR[B], 1e-9*math.Max(1, math.Abs(s.tr.dR)), "round %d, expert %d from node %d to %d", round, e, a/P, B)
					checked++
				}
			}
			for range 5 {
				tryApply(t, rng, s)
			}
		}
	})
	assert.Greater(t, checked, 500)
}

// TestApplyMoveMatchesApply: a swap of two single-copy experts within a
// node applied on the GPUs' tokens alone (applyMove) leaves the state a
// full trial and apply leave: the same slots, copies, GPU tokens (to the
// bit), NIC ports and token counters, and the same cost. Any other move
// goes through apply. It fails if applyMove forgets a copy's GPU, a
// slot, or a GPU's tokens.
func TestApplyMoveMatchesApply(t *testing.T) {
	rng := rand.New(rand.NewPCG(92, 4))
	fast := 0
	for it := range 12 {
		N, P := 1+rng.IntN(3), 2+rng.IntN(3)
		E, K := 8+rng.IntN(10), 1+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dR%d", it, d, N, P, E, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 60+rng.IntN(80), red, d, false)
			ly := firstLayer(t, sc, plan, slots)
			a := newState(ly, int32Copies(plan.ExpertGPUs(0)))
			b := newState(ly, int32Copies(plan.ExpertGPUs(0)))
			for range 40 {
				mv, ok := randomMove(rng, a)
				if !ok {
					break
				}
				if rng.IntN(3) > 0 {
					// Mostly swaps within a node.
					mv.kind = moveSwap
					mv.b = mv.a/P*P + rng.IntN(P)
					if len(a.held[mv.b]) == 0 || !a.valid(mv) {
						continue
					}
					mv.ib = rng.IntN(len(a.held[mv.b]))
					if !a.valid(mv) {
						continue
					}
				}
				if _, _, ok := a.withinNodeLoads(mv); ok {
					fast++
				}
				a.applyMove(mv)
				b.try(mv, levelGPU)
				b.apply(mv)
				require.Equal(t, b.held, a.held)
				require.Equal(t, b.copies(), a.copies())
				require.Equal(t, b.tok, a.tok, "GPU tokens")
				require.Equal(t, b.z, a.z)
				for g := range b.out {
					require.InDelta(t, b.out[g], a.out[g], 1e-9*math.Max(1, b.out[g]))
					require.InDelta(t, b.in[g], a.in[g], 1e-9*math.Max(1, b.in[g]))
				}
				require.InDelta(t, b.costNow(levelGPU), a.costNow(levelGPU), 1e-12*b.costNow(levelGPU))
			}
			// The fast state agrees with a fresh build of its copies.
			c := newState(ly, a.copies())
			for g := range c.tok {
				require.InDelta(t, c.tok[g], a.tok[g], 1e-9*math.Max(1, c.tok[g]))
			}
		})
	}
	assert.Greater(t, fast, 50, "swaps applied without a trial")
}

// TestEvenOutLowersWithinNodes: evenOut never raises a layer's cost, keeps
// every copy on its node and every GPU's slot count, leaves no swap of two
// single-copy experts within a node that lowers the pair's busier GPU
// without raising the cost, and lowers the busiest GPU of a randomly
// placed layer on most instances. A phase that does nothing fails the
// last two; one that swaps across nodes, the second.
func TestEvenOutLowersWithinNodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(93, 5))
	lowered, runs := 0, 0
	for it := range 10 {
		N, P := 1+rng.IntN(3), 2+rng.IntN(3)
		E, K := 12+rng.IntN(12), 1+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dR%d", it, d, N, P, E, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 100+rng.IntN(100), red, d, false)
			ly := firstLayer(t, sc, plan, slots)
			sh := ly.sh
			s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
			before, peak := s.costNow(levelGPU), slices.Max(s.tok)
			nodes := func(st *state) [][]int {
				out := make([][]int, sh.E)
				for e, gs := range st.copies() {
					for _, g := range gs {
						out[e] = append(out[e], int(g)/P)
					}
					slices.Sort(out[e])
				}
				return out
			}
			n0 := nodes(s)
			if sh.nv {
				assert.Zero(t, evenOut(context.Background(), s), "NVLink ports see the GPUs")
				return
			}
			require.Positive(t, evenOut(context.Background(), s))
			runs++
			assert.LessOrEqual(t, s.costNow(levelGPU), before*(1+1e-12))
			assert.Equal(t, n0, nodes(s), "every copy stays on its node")
			for g, es := range s.held {
				assert.Len(t, es, slots[g])
			}
			if slices.Max(s.tok) < peak*(1-1e-9) {
				lowered++
			}
			// No cheap swap is left that evens a pair for nothing.
			scratch := make([]float64, sh.G)
			base := s.baseCost()
			for a := range s.held {
				for b := a + 1; b < (a/P+1)*P; b++ {
					pair := math.Max(s.tok[a], s.tok[b])
					for ia := range s.held[a] {
						for ib := range s.held[b] {
							mv := move{kind: moveSwap, a: a, ia: ia, b: b, ib: ib}
							if !s.valid(mv) {
								continue
							}
							t2, dc := s.withinNode(mv, scratch, base)
							if t2 == nil || dc > 1e-15*base {
								continue
							}
							assert.GreaterOrEqual(t, math.Max(t2[a], t2[b]), pair*(1-1e-9), "swap %+v left", mv)
						}
					}
				}
			}
		})
	}
	assert.GreaterOrEqual(t, lowered, runs/2, "evenOut lowered the busiest GPU")
}

// TestAcrossNodesMatchesTrial: a swap of two single-copy experts between
// nodes priced from the counters (acrossNodes) costs what a trial of it
// costs at either level, and changes the remote copies by as many, before and after random moves, on every
// dispatch model and NIC allowance; every other move is left to the
// trial. It fails if a token using both experts is counted, if a port is
// charged to the wrong node or local index (the cost reads the busiest
// port), or if the GPUs' tokens are not moved.
func TestAcrossNodesMatchesTrial(t *testing.T) {
	rng := rand.New(rand.NewPCG(94, 6))
	priced := 0
	eachFastInstance(t, rng, 16, func(t *testing.T, it int, ly *layer, plan *placement.Plan) {
		sh, P := ly.sh, ly.sh.P
		s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
		s.kappa = float64(it%3) * 0.05
		for range 200 {
			mv, ok := randomMove(rng, s)
			if !ok {
				break
			}
			lv := level(rng.IntN(2))
			fast, ok := s.acrossNodes(mv, lv)
			fastR := s.tr.dR
			want := s.try(mv, lv)
			if ok {
				priced++
				require.InDelta(t, want, fast, 1e-9*math.Max(1e-12, s.costNow(lv)), "move %+v", mv)
				require.InDelta(t, s.tr.dR, fastR, 1e-9*math.Max(1, s.remote()), "remote copies of move %+v", mv)
			} else if !sh.nv && mv.kind == moveSwap && mv.a/P != mv.b/P {
				require.True(t, len(s.cs[s.held[mv.a][mv.ia]].gpus) > 1 || len(s.cs[s.held[mv.b][mv.ib]].gpus) > 1, "a swap of single copies across nodes left to the trial")
			}
			assert.InDelta(t, want, s.price(mv, lv), 1e-9*math.Max(1e-12, s.costNow(lv)), "price")
			if rng.IntN(4) == 0 {
				s.apply(mv)
			}
		}
	})
	assert.Greater(t, priced, 300)
}

// TestBalanceSwapEvensNodes: each swap balanceSwap makes lowers the
// node-level cost (recounted on a fresh state of the result) and does not
// raise the busiest node's load; on layers placed at random it finds such
// swaps on most instances. A balanceSwap that does nothing, or that takes
// a swap without pricing it, fails.
func TestBalanceSwapEvensNodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(95, 7))
	made, runs := 0, 0
	for it := range 12 {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E, K := 10+rng.IntN(12), 2+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%dR%d", it, d, N, P, E, K, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 100+rng.IntN(150), red, d, false)
			ly := firstLayer(t, sc, plan, slots)
			s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
			se := &searcher{s: s, m: task.ByWork(context.Background(), 1<<20), nodeLevel: levelNode}
			runs++
			for range 4 {
				gains := se.relocGains()
				require.NotNil(t, gains)
				before, peak := s.costNow(levelNode), s.imbalance(levelNode)
				if !se.balanceSwap(gains) {
					break
				}
				made++
				fresh := newStateKappa(ly, s.copies(), 0)
				assert.Less(t, fresh.costNow(levelNode), before)
				assert.LessOrEqual(t, fresh.imbalance(levelNode), peak*(1+1e-12))
			}
		})
	}
	assert.GreaterOrEqual(t, made, runs/2, "balance swaps made")
}
