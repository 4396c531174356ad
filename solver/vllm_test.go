package solver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// hashInstance is a vLLM problem whose statistics carry their token order
// (so the cost model counts the hash token by token): two one-GPU nodes,
// three experts and one redundant slot, 40 tokens of top-1 from the two
// ranks in turn. Every token of the hot expert 0 sits in a row that vLLM's
// hash sends to its rank's own copy when expert 0 has a copy on each GPU
// (copies in ascending GPU); the ranks' other tokens go to their own cold
// expert, 1 or 2.
func hashInstance(t *testing.T) Problem {
	t.Helper()
	const T = 40
	tr := &routing.Trace{Tokens: T, Layers: 1, TopK: 1, Experts: 3, Source: make([]int32, T)}
	for tok := range T {
		h, row := tok%2, tok/2 // the ranks' tokens interleaved: a token's row is tok/2
		tr.Source[tok] = int32(h)
		e := int16(1 + h)
		if stackdispatch.VLLMReplica(int64(row), 2) == h {
			e = 0
		}
		tr.IDs = append(tr.IDs, e)
	}
	require.NoError(t, tr.Validate())
	st := tr.Stats(routing.StatsOptions{PathError: -1})
	var err error
	st.Order, err = tr.TokenOrder(0)
	require.NoError(t, err)
	require.NoError(t, costmodel.HashOrder(st, 2))
	m := testkit.FakeModel(3, 1)
	m.Layers = 1
	return Problem{Stats: st, Cluster: testkit.SmallCluster(2, 1), Model: m, Flow: costmodel.FlowHome, Dispatch: placement.DispatchVLLM, RedundantSlots: 1}
}

// Under vLLM's hash counted token by token, SplitOptimal (a chosen split
// carried by the plan) is refused before any search, as for every dispatch
// whose split depends on the source: the cost model could not score the
// plan it would make.
func TestSplitOptimalRefusesCountedHash(t *testing.T) {
	p := hashInstance(t)
	p.Split = SplitOptimal
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyEPLB, Effort: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "two different dispatch policies")
}
