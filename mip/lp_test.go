package mip

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestWriteLPGolden(t *testing.T) {
	b := &Builder{}
	x := b.Binary("x")
	y := b.Col("y", 0, 4, -2.5, false)
	z := b.Col("z", math.Inf(-1), math.Inf(1), 0, false)
	b.AddOffset(3)
	b.Row("cap", -math.Inf(1), 3, []int{x, y}, []float64{1, 1})
	b.Row("link", 1, 1, []int{y, z, y}, []float64{1, -1, 0.5}) // duplicate y summed
	b.Row("range", -1, 2, []int{x, z}, []float64{-1, 2})
	m := b.Model()
	assert.Equal(t, []float64{1.5, -1}, m.RowValue[2:4], "duplicates summed")
	var buf bytes.Buffer
	require.NoError(t, m.WriteLP(&buf))
	golden := filepath.Join("testdata", "small.lp.golden")
	if *update {
		require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), buf.String())
	ok := []float64{1, 4.0 / 3, 1}
	require.NoError(t, m.Check(ok, 1e-9))
	assert.Error(t, m.Check([]float64{0.5, 4.0 / 3, 1}, 1e-9), "fractional binary")
	assert.Error(t, m.Check([]float64{1, 2, 2}, 1e-9), "range violated")
	assert.Error(t, m.Check([]float64{1, 4.0 / 3}, 1e-9), "short vector")
	assert.InDelta(t, 3-2.5*4.0/3, m.Value(ok), 1e-12)
}
