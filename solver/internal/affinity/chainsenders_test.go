package affinity

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// gatherInstance is fmInstance with at least two GPUs a node (so that
// experts can move within one) and its aligner over the start's copies.
func gatherInstance(t *testing.T, rng *rand.Rand, it int) (Problem, *chainExact, *chainAligner, [][][]int32) {
	t.Helper()
	for {
		p, cx := fmInstance(t, rng, it)
		if cx.P < 2 {
			continue
		}
		copies := make([][][]int32, cx.L)
		for l := range copies {
			copies[l] = make([][]int32, cx.E)
			for e, g := range cx.gpu[l] {
				copies[l][e] = []int32{int32(g)}
			}
		}
		ag := newChainAligner(p, copies, 2)
		require.NotNil(t, ag)
		return p, cx, ag, copies
	}
}

// senderCopies counts, token by token, the NIC copies of the phase after
// layer l (l not the last) with layer l's experts on gpu and layer l+1's
// on next: every distinct GPU of a token's layer-l experts sends one copy
// to every node of its layer-(l+1) experts but its own.
func senderCopies(cx *chainExact, l int, gpu, next []int16) float64 {
	K, P := cx.K, cx.P
	total := 0.0
	for t, ct := range cx.cnt {
		reach := map[int]bool{}
		for _, e := range cx.ex[l+1][t*K : (t+1)*K] {
			reach[int(next[e])/P] = true
		}
		senders := map[int]bool{}
		for _, e := range cx.ex[l][t*K : (t+1)*K] {
			senders[int(gpu[e])] = true
		}
		for g := range senders {
			n := len(reach)
			if reach[g/P] {
				n--
			}
			total += ct * float64(n)
		}
	}
	return total
}

// TestGatherGainsMatchRecount: on random chain-flow instances, for every
// layer but the last, the single-move gains are what moving the one
// expert to another GPU of its node saves, counted token by token
// (senderCopies), and the ports gatherInit counts are the exact
// counters' (chainExact's, built on their own) of the phase after the
// layer. Gains counted without the token's other experts, or ports from
// the wrong local index, fail it.
func TestGatherGainsMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(83, 9))
	moves := 0
	for it := range 10 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			_, cx, ag, _ := gatherInstance(t, rng, it)
			P := cx.P
			sc := &gatherScratch{}
			for l := range cx.L - 1 {
				ag.gatherInit(l, sc)
				base := senderCopies(cx, l, cx.gpu[l], cx.gpu[l+1])
				require.InDelta(t, cx.cut[l+1], base, 1e-9*(1+base), "layer %d: the recount is the exact counters'", l)
				for g := range cx.G {
					require.InDelta(t, cx.out[l+1][g], sc.port[g], 1e-9*(1+sc.port[g]), "layer %d GPU %d out", l, g)
					require.InDelta(t, cx.in[l+1][g], sc.port[cx.G+g], 1e-9*(1+sc.port[cx.G+g]), "layer %d GPU %d in", l, g)
				}
				gpu := append([]int16(nil), cx.gpu[l]...)
				for e := range cx.E {
					own := int(gpu[e])
					for j := range P {
						to := own/P*P + j
						if to == own {
							continue
						}
						gpu[e] = int16(to)
						moved := senderCopies(cx, l, gpu, cx.gpu[l+1])
						gpu[e] = int16(own)
						require.InDelta(t, base-moved, sc.gain[e*P+j], 1e-9*(1+base), "layer %d expert %d to GPU %d", l, e, to)
						moves++
					}
				}
			}
		})
	}
	require.Greater(t, moves, 100)
}

// TestGatherKeepsExactTimes: gathering every layer (gatherLayer) keeps
// each expert on its node and each GPU's slots, sends no more NIC copies
// in any phase and raises no layer's compute tail, busiest port or time
// as the exact counters (built afresh) count them, and sends fewer
// copies on most instances. A pass that did nothing fails the last; one
// that swapped at random, or on stale gains without the recount, the
// others.
func TestGatherKeepsExactTimes(t *testing.T) {
	rng := rand.New(rand.NewPCG(89, 3))
	fewer := 0
	for it := range 12 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p, cx, ag, copies := gatherInstance(t, rng, it)
			sc := &gatherScratch{}
			for l := range cx.L - 1 {
				ag.gatherLayer(l, sc)
			}
			gc := make([][][]placement.GPU, cx.L)
			for l := range gc {
				gc[l] = make([][]placement.GPU, cx.E)
				for e, gs := range copies[l] {
					require.Len(t, gs, 1)
					gc[l][e] = []placement.GPU{placement.GPU(gs[0])}
					require.Equal(t, int(cx.gpu[l][e])/cx.P, int(gs[0])/cx.P, "layer %d expert %d left its node", l, e)
				}
			}
			checkPlan(t, gc, cx.E, p.Slots)
			after := newChainExact(p, gc, make([]float64, cx.L))
			require.NotNil(t, after)
			for ph := range cx.cut {
				assert.LessOrEqual(t, after.cut[ph], cx.cut[ph]*(1+1e-12)+1e-9, "phase %d copies", ph)
			}
			for l := range cx.L {
				assert.LessOrEqual(t, after.tail(l, -1, -1, 0), cx.tail(l, -1, -1, 0)*(1+1e-9), "layer %d tail", l)
				assert.LessOrEqual(t, after.portSec(l, nil, -1), cx.portSec(l, nil, -1)*(1+1e-9)+1e-15, "phase %d port", l)
				assert.LessOrEqual(t, after.ltime[l], cx.ltime[l]*(1+1e-9), "layer %d time", l)
			}
			if sumF(after.cut) < sumF(cx.cut)*(1-1e-9) {
				fewer++
			}
		})
	}
	require.Greater(t, fewer, 6, "gathering must save copies on most instances")
}

// TestGatherSwapPricesExactly: every swap gatherSwap makes saves exactly
// the copies the token-by-token recount says, and one it refuses for
// saving none would not have saved any.
func TestGatherSwapPricesExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(97, 1))
	made, refused := 0, 0
	for it := range 10 {
		_, cx, ag, _ := gatherInstance(t, rng, it)
		sc := &gatherScratch{}
		P := cx.P
		for l := range cx.L - 1 {
			ag.gatherInit(l, sc)
			for range 20 {
				e := rng.IntN(cx.E)
				ga := int(sc.gpu[e])
				f := rng.IntN(cx.E)
				gb := int(sc.gpu[f])
				if gb == ga || gb/P != ga/P {
					continue
				}
				gpu := make([]int16, cx.E)
				for x, g := range sc.gpu {
					gpu[x] = int16(g)
				}
				before := senderCopies(cx, l, gpu, cx.gpu[l+1])
				gpu[e], gpu[f] = int16(gb), int16(ga)
				saved := before - senderCopies(cx, l, gpu, cx.gpu[l+1])
				sc.dA, sc.dB = resize(sc.dA, cx.N), resize(sc.dB, cx.N)
				if ag.gatherSwap(sc, int32(e), int32(f), 1, math.Inf(1)) {
					require.Greater(t, saved, 0.0, "layer %d: swap of %d and %d made", l, e, f)
					require.Equal(t, int32(gb), sc.gpu[e])
					made++
				} else {
					require.LessOrEqual(t, saved, 1e-9, "layer %d: swap of %d and %d refused", l, e, f)
					refused++
				}
			}
		}
	}
	require.Greater(t, made, 10)
	require.Greater(t, refused, 10)
}
