package paper

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStage1Recompute(t *testing.T) {
	load := [][]float64{{10, 1, 1, 8}}
	assert.InDelta(t, 16.0, stage1Objective(load, [][]int{{0, 1, 1, 0}}, 2), 1e-12) // 18 vs 2 around 10
	assert.InDelta(t, 2.0, stage1Objective(load, [][]int{{0, 0, 1, 1}}, 2), 1e-12)  // 11 vs 9
}
