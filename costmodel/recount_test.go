package costmodel_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// recountInstance is a GPU-major plan (S slots on each of nodes·gpn GPUs:
// every expert once, the other slots copies of random experts, now and then
// two of one expert on one GPU) and a per-token trace over it whose tokens
// carry source ranks (a few unknown, -1, when unknownSources).
func recountInstance(rng *rand.Rand, nodes, gpn, S, L, E, K, T int, unknownSources bool) (*placement.Plan, *routing.Trace) {
	G := nodes * gpn
	plan := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		var lp placement.LayerPlan
		for p, x := range rng.Perm(G * S) {
			e := x
			if e >= E {
				e = rng.IntN(E)
			}
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(p/S))
		}
		plan.Layers = append(plan.Layers, lp)
	}
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
	hot := rng.IntN(E) // a skewed expert, so that balance differs between models
	for t := range T {
		tr.Source[t] = int32(rng.IntN(G))
		if unknownSources && rng.IntN(5) == 0 {
			tr.Source[t] = -1
		}
		for range L {
			pick := rng.Perm(E)[:K]
			if rng.IntN(2) == 0 && !slices.Contains(pick, hot) {
				pick[0] = hot
			}
			for _, e := range pick {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
	}
	return plan, tr
}

// expectedShares is, for one token of source rank h (in [0, G)) routed to
// an expert whose physical slots are slots (ascending; slot p on GPU p/S),
// the expected share of that token each GPU computes under dispatch d, from
// the rule's definition (placement.Dispatch's doc), written here without
// costmodel's code. The dealt trees are not here: they go through the
// table. remoteFill is the local model's share for a source with no copy on
// its node, which depends on every source (see localRemote).
func expectedShares(d placement.Dispatch, slots []int32, h, G, S, P int, remoteFill []float64) []float64 {
	out := make([]float64, G)
	n := len(slots)
	gpuOf := func(p int32) int { return int(p) / S }
	perSlot := func() {
		for _, p := range slots {
			out[gpuOf(p)] += 1 / float64(n)
		}
	}
	var distinct []int
	for _, p := range slots {
		if g := gpuOf(p); !slices.Contains(distinct, g) {
			distinct = append(distinct, g)
		}
	}
	own := slices.Contains(distinct, h)
	switch d {
	case placement.DispatchEven, placement.DispatchVLLM, placement.DispatchTRTLLM:
		// Every slot takes 1/n of every token (vLLM: the hash's
		// expectation over its rows).
		perSlot()
	case placement.DispatchStaticMean:
		// The own GPU's copy, else every GPU holding a copy evenly.
		if own {
			out[h] = 1
			break
		}
		for _, g := range distinct {
			out[g] += 1 / float64(len(distinct))
		}
	case placement.DispatchLocal:
		var node []int
		for _, g := range distinct {
			if g/P == h/P {
				node = append(node, g)
			}
		}
		switch {
		case own:
			out[h] = 1
		case len(node) > 0:
			for _, g := range node {
				out[g] += 1 / float64(len(node))
			}
		default:
			copy(out, remoteFill)
		}
	case placement.DispatchSGLangDynamic:
		// Newest tree: the only slot; else the first slot on h's GPU; else
		// the first slot on h's node when the node holds some but not all
		// of the slots; else a uniformly random slot per token.
		var onNode []int32
		for _, p := range slots {
			if gpuOf(p)/P == h/P {
				onNode = append(onNode, p)
			}
		}
		switch {
		case n == 1:
			out[gpuOf(slots[0])] = 1
		case own:
			out[h] = 1
		case len(onNode) > 0 && len(onNode) < n:
			out[gpuOf(onNode[0])] = 1
		default:
			perSlot()
		}
	default:
		panic(fmt.Sprintf("no expected shares for %v", d))
	}
	return out
}

// localRemote is the local model's water-filling for one expert: every
// source GPU sends the same tokens; sources with a copy on their GPU or node
// fill those copies first (a[g], in units of one source), and the R
// sources left fill the distinct copy GPUs up to a common level λ with
// Σ max(0, λ − a[g]) = R, found here by bisection. It returns each GPU's
// share of one remote source's tokens, (λ − a[g])⁺ / R (nil when no source
// is remote).
func localRemote(slots []int32, G, S, P int) []float64 {
	var distinct []int
	for _, p := range slots {
		if g := int(p) / S; !slices.Contains(distinct, g) {
			distinct = append(distinct, g)
		}
	}
	a := make([]float64, G)
	R := 0
	for h := range G {
		var node []int
		for _, g := range distinct {
			if g/P == h/P {
				node = append(node, g)
			}
		}
		switch {
		case slices.Contains(distinct, h):
			a[h]++
		case len(node) > 0:
			for _, g := range node {
				a[g] += 1 / float64(len(node))
			}
		default:
			R++
		}
	}
	if R == 0 {
		return nil
	}
	lo, hi := 0.0, float64(G+R)
	for range 200 {
		mid := (lo + hi) / 2
		sum := 0.0
		for _, g := range distinct {
			sum += max(0, mid-a[g])
		}
		if sum < float64(R) {
			lo = mid
		} else {
			hi = mid
		}
	}
	out := make([]float64, G)
	for _, g := range distinct {
		out[g] = max(0, lo-a[g]) / float64(R)
	}
	return out
}

// TestEveryDispatchLoadsMatchRecount: for every dispatch model of the home
// flow, Evaluate's routed tokens per GPU in every layer equal a recount
// token by token, on random GPU-major plans and per-token traces with
// source ranks (Stats built by routing from the trace, so the per-source
// loads are its exact counts): the dealt trees of SGLang's static table
// through the table SGLang builds (stackdispatch.SGLangStaticTable and
// StaticPicker), the others from each token's expected share under the
// rule's definition (expectedShares, localRemote). A token of unknown
// source (-1) counts as an equal share from every rank, as costmodel says
// it takes such tokens. A model that split by slot where its rule splits by
// GPU (or the reverse), took another tree's nearest copy, or dealt with
// another stream, fails.
func TestEveryDispatchLoadsMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	var all []placement.Dispatch
	for d := placement.Dispatch(0); d.Valid(); d++ {
		all = append(all, d)
	}
	require.Len(t, all, 10, "a new dispatch model: give it a recount here")
	checked := 0
	for it := range 30 {
		nodes, gpn, S := 1+it%3, 2+(it/3)%3, 1+it%3
		G := nodes * gpn
		E := max(G*S-rng.IntN(G+1), 2)
		L, K := 1+it%3, 1+rng.IntN(min(3, E))
		plan, tr := recountInstance(rng, nodes, gpn, S, L, E, K, 30+rng.IntN(90), it%4 == 3)
		require.NoError(t, tr.Validate())
		st := tr.Stats(routing.StatsOptions{PathError: -1})
		c := costmodel.Cluster{Name: "tiny", Nodes: nodes, GPUsPerNode: gpn, NVLinkGBps: 2, NICGbps: 4,
			NVLinkLatency: time.Microsecond, NICLatency: 2 * time.Microsecond, TokenCost: time.Microsecond, ExpertCost: 10 * time.Microsecond}
		m := costmodel.Model{Name: "tiny", Layers: L, Experts: E, TopK: K, Hidden: 500, FFN: 1, BytesPerActivation: 2}
		phy := make([][]int32, L)
		for l, lp := range plan.Layers {
			for _, e := range lp.SlotExpert {
				phy[l] = append(phy[l], int32(e))
			}
		}
		cands, err := stackdispatch.CandidatesFromPhy2Log(phy, E)
		require.NoError(t, err)
		for _, d := range all {
			name := fmt.Sprintf("it%d/%dx%d/S%d/E%d/%v", it, nodes, gpn, S, E, d)
			rep, err := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: d}.Evaluate(plan)
			require.NoError(t, err, name)
			var table [][][]int32
			if v, err := stackdispatch.ParseSGLangVariant(d.String()); err == nil {
				table, err = stackdispatch.SGLangStaticTable(cands, G, S, gpn, v, stackdispatch.SGLangInitByMapping)
				require.NoError(t, err, name)
			}
			for l := range L {
				want := make([]float64, G)
				var pick stackdispatch.Picker
				if table != nil {
					pick = stackdispatch.StaticPicker(table, l)
				}
				fill := make([][]float64, E)
				for e := range E {
					fill[e] = localRemote(cands[l][e], G, S, gpn)
				}
				for tok := range tr.Tokens {
					ranks, w := []int{int(tr.Source[tok])}, 1.0
					if ranks[0] < 0 {
						ranks, w = nil, 1/float64(G)
						for h := range G {
							ranks = append(ranks, h)
						}
					}
					for j := range K {
						e := tr.At(tok, l, j)
						for _, h := range ranks {
							if table != nil {
								want[int(pick(int32(h), 0, j, int32(e)))/S] += w
								continue
							}
							for g, x := range expectedShares(d, cands[l][e], h, G, S, gpn, fill[e]) {
								want[g] += w * x
							}
						}
					}
				}
				require.InDeltaSlice(t, want, rep.Layers[l].Tokens, 1e-9, "%s layer %d: tokens per GPU, Evaluate vs recount", name, l)
				checked++
			}
		}
	}
	t.Logf("%d (instance, dispatch, layer) loads checked", checked)
}
