package capfix

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// endsAfter is a context whose Err is nil for its first n calls and
// context.Canceled after: a deadline that passes at a known point of the
// work, without the clock.
type endsAfter struct {
	context.Context
	n int
}

func (c *endsAfter) Err() error {
	if c.n > 0 {
		c.n--
		return nil
	}
	return context.Canceled
}

// TestRepairStopsBetweenTrials: repairLayer consults its context between
// two trials, not only between two moves. With a context that ends right
// after the step's first check it makes no move; with one that does not
// end, the same call moves the layer towards the cap (so the instance has
// a move to make). A repair that priced every candidate of a step before
// looking at the clock, minutes past the deadline under SGLang's table,
// makes the move and fails.
func TestRepairStopsBetweenTrials(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 2))
	G, S, E, K := 4, 3, 10, 2
	tr := &routing.Trace{Tokens: 400, Layers: 1, TopK: K, Experts: E, Source: make([]int32, 400)}
	for tok := range tr.Tokens {
		tr.Source[tok] = int32(rng.IntN(G))
		pick := rng.Perm(E)[:K]
		if rng.IntN(3) > 0 && !slices.Contains(pick, 0) {
			pick[0] = 0 // a hot expert
		}
		for _, e := range pick {
			tr.IDs = append(tr.IDs, int16(e))
		}
	}
	require.NoError(t, tr.Validate())
	st := tr.Stats(routing.StatsOptions{PathError: -1})
	m := testkit.FakeModel(E, K)
	m.Layers = 1
	sc := costmodel.Scenario{Stats: st, Cluster: testkit.SmallCluster(2, 2), Model: m, Dispatch: placement.DispatchSGLangStatic}
	// Expert 0 and its two spare copies' partners crowd GPU 0.
	lp := placement.LayerPlan{}
	holds := [][]int{{0, 1, 2}, {0, 3, 4}, {5, 6, 7}, {8, 9, 1}}
	for g, es := range holds {
		for _, e := range es {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
		}
	}
	require.Len(t, lp.SlotExpert, G*S)
	plan := &placement.Plan{GPUs: G, Experts: E, Layers: []placement.LayerPlan{lp}}
	require.NoError(t, plan.Validate(placement.ValidateOptions{Experts: E, Layers: 1}))
	speed := []float64{1, 1, 1, 1}
	p := Problem{Scenario: sc, MaxImbalance: 1.0001}
	run := func(ctx context.Context) placement.LayerPlan {
		ev, err := sc.NewEvaluator(plan)
		require.NoError(t, err)
		repairLayer(ctx, p, ev, 0, speed, time.Now().Add(time.Hour))
		return cloneLayer(ev.Layer(0))
	}
	assert.NotEqual(t, lp, run(context.Background()), "with time the repair moves the layer")
	assert.Equal(t, lp, run(&endsAfter{Context: context.Background(), n: 1}), "ended after the step's first check: no trial, no move")
}
