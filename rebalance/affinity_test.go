package rebalance

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// plantedTokens draws n tokens of L layers, top-k, homed round-robin on G
// ranks of gpn per node: a token picks its k experts at every layer from
// its node's group of E/nodes consecutive experts. Every expert is equally
// popular, so balance is indifferent to where the groups go, and a plan
// with each group on its node sends no token off its node.
func plantedTokens(rng *rand.Rand, n, L, E, K, G, gpn int) *routing.Trace {
	nodes := G / gpn
	per := E / nodes
	t := &routing.Trace{Tokens: n, Layers: L, TopK: K, Experts: E, Source: make([]int32, n)}
	for tok := range n {
		src := tok % G
		t.Source[tok] = int32(src)
		base := src / gpn * per
		for range L {
			for _, j := range rng.Perm(per)[:K] {
				t.IDs = append(t.IDs, int16(base+j))
			}
		}
	}
	return t
}

// interleaved is a plan that puts expert e on GPU e mod G in every layer,
// so that every node holds experts of every group, plus extra copies of
// experts 0..extra·G−1 on GPU (e+1) mod G.
func interleaved(L, E, G, extra int) *placement.Plan {
	p := &placement.Plan{GPUs: G, Experts: E}
	for range L {
		var lp placement.LayerPlan
		for e := range E {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(e%G))
		}
		for e := range extra * G {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU((e+1)%G))
		}
		p.Layers = append(p.Layers, lp)
	}
	return p
}

// TestProposePathsCutsRemoteCopies: on 2 nodes × 2 GPUs whose tokens keep
// to their node's half of the experts, a plan that interleaves the halves
// sends most tokens' copies off their node. Propose on the tokens, under
// a work budget, must send fewer remote copies than the running plan,
// change at most MaxMoves slots per layer, keep every GPU's slots, and
// leave the running plan in force until installed. Under local dispatch
// the remote copies are recounted here from the plans' GPUs; under
// SGLang's table, which may deal a rank to a copy on the other node while
// its own node holds one, the cost model's count must drop. A rebalancer
// that proposes nothing, or ignores the budget, fails.
func TestProposePathsCutsRemoteCopies(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	cur := interleaved(L, E, G, 1)
	rng := rand.New(rand.NewPCG(7, 7))
	steps := []*routing.Trace{plantedTokens(rng, 100, L, E, K, G, gpn), plantedTokens(rng, 100, L, E, K, G, gpn)}
	// 4 kB activations: a remote copy (8 µs over the NIC) costs more than
	// the compute of a token (1 µs), so that the cut is worth more than
	// the balance the draws leave.
	m := tinyModel(L, E, K)
	m.Hidden = 2048
	for _, c := range []struct {
		d     placement.Dispatch
		moves int
	}{{placement.DispatchLocal, 2}, {placement.DispatchLocal, 4}, {placement.DispatchSGLangStatic, 4}} {
		d, moves := c.d, c.moves
		{
			r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: m, Initial: cur,
				Dispatch: d, Solver: solver.Options{Effort: 1}})
			require.NoError(t, err)
			for _, st := range steps {
				require.NoError(t, r.Observe(Step{Tokens: st}))
			}
			prop, err := r.Propose(context.Background(), Budget{MaxMoves: moves})
			require.NoError(t, err, "%v, MaxMoves %d", d, moves)
			require.True(t, prop.Paths)
			assert.Equal(t, 2, prop.PathSteps)
			assert.InDelta(t, 200, prop.PathTokens, 1e-9)
			assert.Less(t, prop.Remote, prop.CurrentRemote, "%v, MaxMoves %d: the proposal must cut the remote copies", d, moves)
			// The reported remote copies and layer times are the plans'
			// own, recomputed by the cost model.
			for _, c := range []struct {
				plan          *placement.Plan
				remote, layer float64
			}{{cur, prop.CurrentRemote, prop.CurrentLayerSec}, {prop.Plan, prop.Remote, prop.LayerSec}} {
				rep, err := costmodel.Scenario{Stats: tokenStats(steps), Cluster: tinyCluster(G/gpn, gpn), Model: m, Dispatch: d}.Evaluate(c.plan)
				require.NoError(t, err)
				assert.InDelta(t, rep.TimeSec, c.layer, 1e-12*rep.TimeSec)
				assert.InDelta(t, rep.RemoteCopies/rep.Tokens/L, c.remote, 1e-12)
			}
			if d == placement.DispatchLocal {
				before, after := remoteCopies(cur, steps, gpn), remoteCopies(prop.Plan, steps, gpn)
				assert.InDelta(t, before, prop.CurrentRemote, 1e-9, "the current plan's remote copies per token-layer")
				assert.InDelta(t, after, prop.Remote, 1e-9, "the proposal's remote copies per token-layer")
			}
			for l, lp := range prop.Plan.Layers {
				n := placement.ChangedSlots(cur.Layers[l], lp)
				assert.Equal(t, n, prop.Moved[l])
				if moves > 0 {
					assert.LessOrEqual(t, n, moves, "layer %d", l)
				}
				assert.Equal(t, cur.SlotsPerGPU(l), prop.Plan.SlotsPerGPU(l))
			}
			require.NoError(t, prop.Plan.Validate(placement.ValidateOptions{Experts: E, Layers: L}))
			assert.Equal(t, cur, r.Current(), "Propose does not install")
		}
	}
}

// tokenStats is the statistics of the steps' tokens with every path.
func tokenStats(steps []*routing.Trace) *routing.Stats {
	var out routing.Stats
	for _, t := range steps {
		if err := out.Merge(t.Stats(routing.StatsOptions{PathError: -1})); err != nil {
			panic(err)
		}
	}
	return &out
}

// remoteCopies recounts the remote-node copies per token-layer of plan on
// the tokens of a two-node cluster under local dispatch: a token sends a
// copy to the other node at a layer exactly when one of its experts has
// no copy on its home node.
func remoteCopies(plan *placement.Plan, steps []*routing.Trace, gpn int) float64 {
	total, n := 0.0, 0.0
	for _, t := range steps {
		for tok := range t.Tokens {
			home := int(t.Source[tok]) / gpn
			for l := range t.Layers {
				gs := plan.ExpertGPUs(l)
				remote := 0.0
				for j := range t.TopK {
					e := t.IDs[(tok*t.Layers+l)*t.TopK+j]
					if !slices.ContainsFunc(gs[e], func(g placement.GPU) bool { return int(g)/gpn == home }) {
						remote = 1
					}
				}
				total += remote
				n++
			}
		}
	}
	return total / n
}

// TestObserveTokensBadInput: per-token steps that do not fit the model or
// the cluster are refused with an error naming the field, record nothing,
// and never panic.
func TestObserveTokensBadInput(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	good := func() *routing.Trace {
		return plantedTokens(rand.New(rand.NewPCG(1, 1)), 6, L, E, K, G, gpn)
	}
	for _, c := range []struct {
		name string
		edit func(*Step)
		want string
	}{
		{"wrong layer count", func(s *Step) { s.Tokens.Layers = L + 1 }, "Step.Tokens has 3 layers"},
		{"wrong top-k", func(s *Step) { s.Tokens.TopK = K + 1 }, "of top-3, the model 2 layers of top-2"},
		{"wrong expert count", func(s *Step) { s.Tokens.Experts = E * 2 }, "Step.Tokens.Experts = 16"},
		{"expert out of range", func(s *Step) { s.Tokens.IDs[5] = E }, "expert 8 out of range [0,8)"},
		{"negative expert", func(s *Step) { s.Tokens.IDs[0] = -1 }, "expert -1 out of range"},
		{"expert twice", func(s *Step) { s.Tokens.IDs[1] = s.Tokens.IDs[0] }, "appears twice"},
		{"short ids", func(s *Step) { s.Tokens.IDs = s.Tokens.IDs[:3] }, "len(IDs) = 3"},
		{"source out of range", func(s *Step) { s.Tokens.Source[2] = G }, "Step.Tokens.Source[2] = 4, out of range"},
		{"source below -1", func(s *Step) { s.Tokens.Source[0] = -2 }, "source -2"},
		{"short sources", func(s *Step) { s.Tokens.Source = s.Tokens.Source[:1] }, "len(Source) = 1"},
		{"load disagrees", func(s *Step) { s.Load = tokenLoad(s.Tokens); s.Load[1][3]++ }, "Step.Load[1][3]"},
		{"load of the wrong shape", func(s *Step) { s.Load = [][]float64{{1}} }, "load has 1 layers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), RedundantSlots: G})
			require.NoError(t, err)
			s := Step{Tokens: good()}
			c.edit(&s)
			err = r.Observe(s)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			_, err = r.Propose(context.Background(), Budget{})
			assert.ErrorContains(t, err, "no load steps observed yet", "a refused step is not recorded")
		})
	}
	r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), RedundantSlots: G})
	require.NoError(t, err)
	s := Step{Tokens: good()}
	s.Load = tokenLoad(s.Tokens)
	require.NoError(t, r.Observe(s), "a Load equal to the tokens' counts is accepted")
	_, err = New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), Dispatch: placement.Dispatch(99)})
	assert.ErrorContains(t, err, "Config.Dispatch 99")
}

// TestPathWindowKeepsDecayedPaths: the paths a window holds after any
// sequence of steps (some count-only) are those of the last Window steps,
// each token weighted Decay^age, with the load they add up to, recounted
// here token by token; with no Window limit they are those of the steps
// whose weight is at least pathDropShare's decay age; past a bound on its
// tokens only the newest steps' paths (the newest step with tokens
// whatever its size). A decay of 0.01 drives the scale past scaleLimit within the
// steps, so its folding is checked too.
func TestPathWindowKeepsDecayedPaths(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	for _, c := range []struct {
		window    int
		decay     float64
		maxTokens int // 0: pathTokens's
	}{{3, 1, 0}, {3, 0.5, 0}, {4, 0.01, 0}, {-1, 0.5, 0}, {6, 0.9, 7}, {6, 0.9, 1}} {
		r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), RedundantSlots: G, Window: c.window, Decay: c.decay})
		require.NoError(t, err)
		if c.maxTokens > 0 {
			for _, w := range r.paths {
				w.maxTokens = c.maxTokens
			}
		}
		rng := rand.New(rand.NewPCG(3, uint64(c.window)))
		var seen []*routing.Trace // nil: a count-only step
		for i := range 80 {
			if i%5 == 4 {
				load := matrix(L, E)
				load[0][0] = 1
				require.NoError(t, r.Observe(Step{Load: load}))
				seen = append(seen, nil)
				continue
			}
			tr := plantedTokens(rng, 1+rng.IntN(4), L, E, K, G, gpn)
			require.NoError(t, r.Observe(Step{Tokens: tr}))
			seen = append(seen, tr)
		}
		keep := c.window
		if keep < 0 {
			keep = pathSteps(c.decay)
		}
		want := map[string]float64{}
		load := matrix(L, E)
		tokens := 0
		for age := range keep {
			tr := seen[len(seen)-1-age]
			if tr == nil {
				continue
			}
			if tokens += tr.Tokens; c.maxTokens > 0 && tokens > c.maxTokens && tokens > tr.Tokens {
				// Past the token bound only the newer steps' paths stay,
				// the newest always.
				break
			}
			w := math.Pow(c.decay, float64(age))
			for tok := range tr.Tokens {
				path := slices.Clone(tr.IDs[tok*L*K : (tok+1)*L*K])
				for l := range L {
					slices.Sort(path[l*K : (l+1)*K])
					for _, e := range path[l*K : (l+1)*K] {
						load[l][e] += w
					}
				}
				var b strings.Builder
				pathKey(&b, tr.Source[tok], path)
				want[b.String()] += w
			}
		}
		s, err := r.snapshot(PhaseAny)
		require.NoError(t, err)
		require.NotNil(t, s.paths)
		require.NoError(t, s.paths.Validate())
		got := map[string]float64{}
		for _, p := range s.paths.Patterns {
			var b strings.Builder
			pathKey(&b, p.Source, p.Experts)
			got[b.String()] = p.Count
		}
		require.Len(t, got, len(want), "window %d decay %v: distinct paths", c.window, c.decay)
		for k, w := range want {
			assert.InDelta(t, w, got[k], 1e-9*w, "window %d decay %v", c.window, c.decay)
		}
		for l := range L {
			for e := range E {
				assert.InDelta(t, load[l][e], s.paths.Load[l][e], 1e-9*(1+load[l][e]))
			}
		}
	}
}

// TestProposePathsHorizon: on the planted instance, moves whose weights
// take far longer to send than a step saves are left out within a short
// horizon and made within a long one.
func TestProposePathsHorizon(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	cur := interleaved(L, E, G, 1)
	rng := rand.New(rand.NewPCG(7, 7))
	m := tinyModel(L, E, K)
	m.Hidden = 2048
	m.BytesPerExpert = 1e6 // 2 ms a slot over the 0.5 GB/s NIC
	for _, c := range []struct {
		horizon int
		moves   bool
	}{{1, false}, {1_000_000, true}} {
		r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: m, Initial: cur,
			Dispatch: placement.DispatchLocal, Solver: solver.Options{Effort: 1}})
		require.NoError(t, err)
		require.NoError(t, r.Observe(Step{Tokens: plantedTokens(rng, 100, L, E, K, G, gpn)}))
		prop, err := r.Propose(context.Background(), Budget{MaxMoves: 4, Horizon: c.horizon})
		require.NoError(t, err)
		if !c.moves {
			assert.Zero(t, prop.MovedSlots, "horizon %d", c.horizon)
			assert.Equal(t, prop.CurrentRemote, prop.Remote)
			continue
		}
		assert.Positive(t, prop.MovedSlots, "horizon %d", c.horizon)
		assert.Less(t, prop.Remote, prop.CurrentRemote)
		assert.Greater(t, (prop.CurrentLayerSec-prop.LayerSec)/float64(prop.PathSteps)*float64(c.horizon), prop.MigrationSec, "the gain over the horizon pays the migration")
	}
}

// TestConcurrentObserveTokens: per-token steps arrive while proposals on
// their paths are solved and installed (run with -race); the proposals'
// limit is a time budget, and only their validity is checked.
func TestConcurrentObserveTokens(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), Initial: interleaved(L, E, G, 1),
		Window: 5, Decay: 0.9, Dispatch: placement.DispatchSGLangStatic})
	require.NoError(t, err)
	require.NoError(t, r.Observe(Step{Tokens: plantedTokens(rand.New(rand.NewPCG(1, 1)), 20, L, E, K, G, gpn)}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(2, 2))
		for range 100 {
			if err := r.Observe(Step{Tokens: plantedTokens(rng, 20, L, E, K, G, gpn)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 5 {
		prop, err := r.Propose(context.Background(), Budget{MaxMoves: 2, Time: 50 * time.Millisecond})
		require.NoError(t, err)
		require.True(t, prop.Paths)
		require.NoError(t, r.Install(prop.Plan))
	}
	<-done
}

// TestObserveTokensNeverPanics: random per-token steps of every shape,
// most of them wrong (layers, top-k, experts, ids, sources and loads of
// the wrong size or out of range), are recorded or refused with an error,
// never a panic, and a proposal after them still works.
func TestObserveTokensNeverPanics(t *testing.T) {
	const L, E, K, G, gpn = 2, 8, 2, 4, 2
	r, err := New(Config{Cluster: tinyCluster(G/gpn, gpn), Model: tinyModel(L, E, K), Initial: interleaved(L, E, G, 1), Window: 4})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(9, 9))
	pick := func(good, n int) int { // good, or another size in [0, n) a third of the time
		if rng.IntN(3) == 0 {
			return rng.IntN(n)
		}
		return good
	}
	accepted := 0
	for range 2000 {
		tr := &routing.Trace{Tokens: rng.IntN(4), Layers: pick(L, 4), TopK: pick(K, 4), Experts: pick(E, 10)}
		n := pick(tr.Tokens*tr.Layers*tr.TopK, 12)
		for range n {
			tr.IDs = append(tr.IDs, int16(rng.IntN(E+3)-1))
		}
		if rng.IntN(2) == 0 {
			for range pick(tr.Tokens, 5) {
				tr.Source = append(tr.Source, int32(rng.IntN(G+3)-2))
			}
		}
		st := Step{Tokens: tr, Phase: Phase(pick(int(PhasePrefill), 4))}
		if rng.IntN(3) == 0 {
			st.Load = matrix(pick(L, 4), pick(E, 10))
		}
		assert.NotPanics(t, func() {
			if r.Observe(st) == nil {
				accepted++
			}
		})
	}
	assert.Positive(t, accepted, "some random steps are valid")
	prop, err := r.Propose(context.Background(), Budget{MaxMoves: 2, Time: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, prop.Plan.Validate(placement.ValidateOptions{Experts: E, Layers: L}))
}
