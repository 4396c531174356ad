package capfix

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestLayersOver counts the layers whose busiest GPU per unit of speed is
// above the cap, recomputed here from the tokens.
func TestLayersOver(t *testing.T) {
	c := testkit.SmallCluster(1, 4)
	rep := &costmodel.Report{Layers: []costmodel.LayerReport{
		{Tokens: []float64{10, 10, 10, 10}}, // 1.0
		{Tokens: []float64{13, 9, 9, 9}},    // 1.3
		{Tokens: []float64{11, 10, 10, 9}},  // 1.1
	}}
	for _, tc := range []struct {
		name  string
		limit float64
		want  int
	}{
		{"no cap", 0, 0},
		{"under every layer", 0.9, 3},
		{"between", 1.05, 2},
		{"at the largest", 1.3, 0},
		{"above", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, LayersOver(c, rep, tc.limit))
		})
	}
}

// TestDigitsAbove checks that a floor and the cap it exceeds print
// differently, and that roundTo rounds the way its caller asks.
func TestDigitsAbove(t *testing.T) {
	for _, tc := range []struct{ x, limit float64 }{
		{1.00015, 1.0001}, {1.2, 1.1}, {1.00000012, 1.0000001}, {1.5, 1.49999},
	} {
		d := digitsAbove(tc.x, tc.limit)
		v, err := strconv.ParseFloat(roundTo(tc.x, d, math.Floor), 64)
		assert.NoError(t, err)
		assert.Greater(t, v, tc.limit, "x %v limit %v: %d digits", tc.x, tc.limit, d)
		assert.LessOrEqual(t, v, tc.x)
		up, _ := strconv.ParseFloat(roundTo(tc.x, d, math.Ceil), 64)
		assert.GreaterOrEqual(t, up, tc.x)
	}
	assert.Equal(t, "1.0014", roundTo(1.0014, 4, math.Ceil), "an exact value stays put")
	assert.Equal(t, "1.0013", roundTo(1.00139, 4, math.Floor))
}
