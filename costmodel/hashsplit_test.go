package costmodel_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// hashRecount counts, token by token, what vLLM's hash sends to every GPU
// in layer l of plan (GPU-major, S slots per GPU): a token's row is its
// index among its rank's tokens of its step (of the trace without steps),
// modulo B when B > 0, written here without routing's or costmodel's code;
// its copy is the row's VLLMReplica among the expert's slots in ascending
// slot id (vLLM's logical_to_physical_map as EPLBMaps writes it). A token
// of unknown source counts an even share of every slot.
func hashRecount(tr *routing.Trace, cands [][]int32, l, G, S, B int) []float64 {
	want := make([]float64, G)
	for tok, r := range tr.Source {
		row := 0
		for u := range tok {
			if tr.Source[u] == r && (tr.Step == nil || tr.Step[u] == tr.Step[tok]) {
				row++
			}
		}
		if B > 0 {
			row %= B
		}
		for j := range tr.TopK {
			slots := cands[tr.At(tok, l, j)]
			if r < 0 {
				for _, p := range slots {
					want[int(p)/S] += 1 / float64(len(slots))
				}
				continue
			}
			want[int(slots[stackdispatch.VLLMReplica(int64(row), len(slots))])/S]++
		}
	}
	return want
}

// TestVLLMHashLoadsMatchRecount: with the trace's token order attached,
// Evaluate's routed tokens per GPU under vLLM's dispatch equal the hash
// recounted token by token (hashRecount) to 1e-9, on random GPU-major
// plans (some with two slots of an expert on one GPU), traces with and
// without steps and unknown sources, and forward passes of B tokens per
// rank; so does the incremental Evaluator after random moves. A model that
// took the copies in another order, counted rows across steps or took the
// expectation fails.
func TestVLLMHashLoadsMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 1))
	checked, differs := 0, 0
	for it := range 24 {
		nodes, gpn, S := 1+it%2, 2+(it/2)%3, 1+it%3
		G := nodes * gpn
		E := max(G*S-rng.IntN(G+1), 2)
		L, K := 1+it%3, 1+rng.IntN(min(3, E))
		plan, tr := recountInstance(rng, nodes, gpn, S, L, E, K, 40+rng.IntN(120), it%4 == 3)
		if it%3 == 1 {
			tr.Step = make([]int32, tr.Tokens)
			for tok := 1; tok < tr.Tokens; tok++ {
				tr.Step[tok] = tr.Step[tok-1] + int32(rng.IntN(9)/8)
			}
		}
		B := []int{0, 1, 3, 8}[it%4]
		name := fmt.Sprintf("it%d/%dx%d/S%d/E%d/B%d", it, nodes, gpn, S, E, B)
		st := tr.Stats(routing.StatsOptions{PathError: -1})
		var err error
		st.Order, err = tr.TokenOrder(B)
		require.NoError(t, err, name)
		require.NoError(t, costmodel.HashOrder(st, G), name)
		c := costmodel.Cluster{Name: "tiny", Nodes: nodes, GPUsPerNode: gpn, NVLinkGBps: 2, NICGbps: 4,
			NVLinkLatency: time.Microsecond, NICLatency: 2 * time.Microsecond, TokenCost: time.Microsecond, ExpertCost: 10 * time.Microsecond}
		m := costmodel.Model{Name: "tiny", Layers: L, Experts: E, TopK: K, Hidden: 500, FFN: 1, BytesPerActivation: 2}
		sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchVLLM}
		check := func(p *placement.Plan, tokens func(l int) []float64, what string) {
			t.Helper()
			phy := make([][]int32, L)
			for l, lp := range p.GPUMajor().Layers {
				for _, e := range lp.SlotExpert {
					phy[l] = append(phy[l], int32(e))
				}
			}
			cands, err := stackdispatch.CandidatesFromPhy2Log(phy, E)
			require.NoError(t, err, name)
			slotsPer := len(p.Layers[0].SlotExpert) / G
			even, err := costmodel.Scenario{Stats: st, Cluster: c, Model: m}.Evaluate(p)
			require.NoError(t, err, name)
			for l := range L {
				want := hashRecount(tr, cands[l], l, G, slotsPer, B)
				require.InDeltaSlice(t, want, tokens(l), 1e-9, "%s %s layer %d: tokens per GPU, model vs hash recount", name, what, l)
				checked++
				for g := range G {
					if d := want[g] - even.Layers[l].Tokens[g]; d > 1e-6 || d < -1e-6 {
						differs++
						break
					}
				}
			}
		}
		rep, err := sc.Evaluate(plan)
		require.NoError(t, err, name)
		check(plan, func(l int) []float64 { return rep.Layers[l].Tokens }, "Evaluate")
		ev, err := sc.NewEvaluator(plan)
		require.NoError(t, err, name)
		for range 4 {
			l := rng.IntN(L)
			n := len(ev.Layer(l).SlotExpert)
			mv := costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: rng.IntN(n), Other: rng.IntN(n)}
			if rng.IntN(2) == 0 {
				mv = costmodel.Move{Kind: costmodel.MoveRetarget, Layer: l, Slot: rng.IntN(n), Expert: routing.Expert(rng.IntN(E))}
			}
			if _, err := ev.Delta(mv); err != nil {
				continue // a retarget that drops an expert's last copy
			}
			require.NoError(t, ev.Apply(mv), name)
		}
		check(ev.Plan(), ev.Tokens, "Evaluator after moves")
	}
	t.Logf("%d (instance, layer) loads checked, %d of them off the even expectation", checked, differs)
	assert.Greater(t, differs, checked/4, "the hash must differ from its expectation on most layers, or the test proves nothing")
}

// TestVLLMHashFallsBack: without a token order, or with one that does not
// count these statistics' per-source loads, vLLM's dispatch is its
// expectation (the even split), and HashOrder says why.
func TestVLLMHashFallsBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	plan, tr := recountInstance(rng, 1, 4, 2, 2, 6, 2, 80, false)
	st := tr.Stats(routing.StatsOptions{PathError: -1})
	c := costmodel.Cluster{Name: "tiny", Nodes: 1, GPUsPerNode: 4, NVLinkGBps: 2, NICGbps: 4, TokenCost: time.Microsecond}
	m := costmodel.Model{Name: "tiny", Layers: 2, Experts: 6, TopK: 2, Hidden: 500, FFN: 1, BytesPerActivation: 2}
	even, err := costmodel.Scenario{Stats: st, Cluster: c, Model: m}.Evaluate(plan)
	require.NoError(t, err)
	require.ErrorContains(t, costmodel.HashOrder(st, 4), "no token order")
	_, other := recountInstance(rng, 1, 4, 2, 2, 6, 2, 80, false)
	st.Order, err = other.TokenOrder(0)
	require.NoError(t, err)
	require.ErrorContains(t, costmodel.HashOrder(st, 4), "not these statistics' order")
	for _, s := range []*routing.Stats{st, tr.Stats(routing.StatsOptions{PathError: -1})} {
		rep, err := costmodel.Scenario{Stats: s, Cluster: c, Model: m, Dispatch: placement.DispatchVLLM}.Evaluate(plan)
		require.NoError(t, err)
		for l := range rep.Layers {
			require.InDeltaSlice(t, even.Layers[l].Tokens, rep.Layers[l].Tokens, 1e-9)
		}
	}
}

// TestVLLMHashCounts: VLLMHashCounts gives each copy the rows whose
// VLLMReplica, among the expert's copies in ascending physical id (GPU
// by GPU, a GPU's copies in its order), names it, on random copies given
// with their GPUs in random order and some GPUs holding several copies. A
// count that took the copies in the order given, or split the rows evenly,
// fails.
func TestVLLMHashCounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	for it := range 200 {
		G := 1 + rng.IntN(8)
		gpus := rng.Perm(G)[:1+rng.IntN(G)]
		var g32, slots []int32
		for _, g := range gpus {
			g32 = append(g32, int32(g))
			slots = append(slots, int32(1+rng.IntN(3)))
		}
		// Physical ids: GPU g's k-th copy is g·4+k.
		var phys []int
		entry := map[int]int{} // physical id → entry of counts
		off := 0
		for i, g := range g32 {
			for k := range slots[i] {
				entry[int(g)*4+int(k)] = off + int(k)
			}
			off += int(slots[i])
		}
		for p := range 4 * G {
			if _, ok := entry[p]; ok {
				phys = append(phys, p)
			}
		}
		rows := make([]int32, rng.IntN(300))
		for i := range rows {
			rows[i] = int32(rng.IntN(1000))
		}
		want := make([]int, off)
		for _, r := range rows {
			want[entry[phys[stackdispatch.VLLMReplica(int64(r), len(phys))]]]++
		}
		got := make([]int, off)
		costmodel.VLLMHashCounts(g32, slots, rows, got)
		require.Equal(t, want, got, "case %d: gpus %v slots %v", it, g32, slots)
	}
	got := []int{0}
	costmodel.VLLMHashCounts(nil, nil, []int32{1, 2}, got[:0])
	assert.Equal(t, []int{0}, got, "no copies: nothing counted")
}
