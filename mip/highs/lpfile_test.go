package highs

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	gohighs "github.com/bartolsthoorn/gohighs/highs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/mip"
)

// TestGoLPFileReadsBackInHiGHS checks that mip.Model.WriteLP (written in
// Go) is a model HiGHS parses into the same problem: same optimum.
func TestGoLPFileReadsBackInHiGHS(t *testing.T) {
	inf := math.Inf(1)
	m := &mip.Model{
		Names:    []string{"x", "y", "z"},
		Cost:     []float64{-1, -2.5, 0.5},
		Lower:    []float64{0, 0, -inf},
		Upper:    []float64{1, 4, inf},
		Integer:  []bool{true, false, false},
		Offset:   3,
		RowNames: []string{"cap", "link", "range"},
		RowLower: []float64{-inf, 1, -1},
		RowUpper: []float64{3, 1, 2},
		RowStart: []int{0, 2, 4, 6},
		RowIndex: []int{0, 1, 1, 2, 0, 2},
		RowValue: []float64{1, 1, 1.5, -1, -1, 2},
	}
	path := filepath.Join(t.TempDir(), "m.lp")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, m.WriteLP(f))
	require.NoError(t, f.Close())

	ours, err := Backend{}.Solve(context.Background(), m, mip.Options{RelGap: 1e-9})
	require.NoError(t, err)
	require.Equal(t, mip.Optimal, ours.Status)

	s, err := gohighs.NewSolver()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.SetBoolOption("output_flag", false))
	require.NoError(t, s.ReadModel(path))
	sol, err := s.Run()
	require.NoError(t, err)
	require.True(t, sol.IsOptimal())
	assert.InDelta(t, ours.Objective, sol.Objective, 1e-7)
	assert.InDelta(t, m.Value(ours.X), sol.Objective, 1e-7)
}
