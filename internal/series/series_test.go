package series

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

func twoWorkloads() []*routing.Stats {
	a := routing.StatsFromLoad([][]float64{{90, 10, 0, 0}, {50, 50, 0, 0}}, 2)
	b := routing.StatsFromLoad([][]float64{{0, 0, 10, 90}, {0, 0, 50, 50}}, 2)
	return []*routing.Stats{a, b}
}

// TestMixDraws: every step routes exactly tokens × k per layer, never to
// an expert that no workload uses, the spotlight turns (the first steps
// favour workload 0, a half period later workload 1), and the same seed
// gives the same series. Catches draws that lose or invent routings and a
// mix that does not move.
func TestMixDraws(t *testing.T) {
	opts := MixOptions{Steps: 40, TokensPerStep: 500, Period: 40, Seed: 3}
	s, err := Mix(twoWorkloads(), opts)
	require.NoError(t, err)
	require.Len(t, s, 40)
	for i, st := range s {
		for l, row := range st {
			sum := 0.0
			for _, v := range row {
				assert.Equal(t, math.Trunc(v), v)
				sum += v
			}
			assert.Equal(t, 1000.0, sum, "step %d layer %d", i, l)
		}
	}
	share0 := func(st [][]float64) float64 { return (st[0][0] + st[0][1]) / 1000 }
	assert.Greater(t, share0(s[0]), 0.8) // exp(2)/(exp(2)+exp(-2)) ≈ 0.98
	assert.Less(t, share0(s[20]), 0.2)   // half a turn later
	again, err := Mix(twoWorkloads(), opts)
	require.NoError(t, err)
	assert.Equal(t, s, again)
	opts.Seed = 4
	other, err := Mix(twoWorkloads(), opts)
	require.NoError(t, err)
	assert.NotEqual(t, s, other)
}

func TestMixErrors(t *testing.T) {
	_, err := Mix(nil, MixOptions{Steps: 1, TokensPerStep: 1})
	assert.ErrorContains(t, err, "no workloads")
	w := twoWorkloads()
	w[1] = routing.StatsFromLoad([][]float64{{1, 1, 1}}, 2)
	_, err = Mix(w, MixOptions{Steps: 1, TokensPerStep: 1})
	assert.ErrorContains(t, err, "workload 1 is 1 layers × 3 experts")
	_, err = Mix(twoWorkloads(), MixOptions{Steps: 0, TokensPerStep: 1})
	assert.ErrorContains(t, err, "0 steps")
}

// TestCutAndEncode: cutting a trace into steps keeps every routing, and
// the logical_count JSON reads back (dense rows dropped, layer ids kept)
// as the same steps.
func TestCutAndEncode(t *testing.T) {
	src, err := routing.Load("../../testdata/flame-moe-290m/trace.jsonl", routing.LoadOptions{NoPatterns: true})
	require.NoError(t, err)
	steps, err := Cut(src.Trace, 100)
	require.NoError(t, err)
	require.Len(t, steps, 11) // 1024 tokens: 10 of 100 and one of 24
	sum := make([][]float64, 8)
	for l := range sum {
		sum[l] = make([]float64, 64)
	}
	for _, st := range steps {
		for l, row := range st {
			for e, v := range row {
				sum[l][e] += v
			}
		}
	}
	assert.Equal(t, src.Stats.Load, sum)
	data, err := EncodeLogicalCount(steps, src.Stats.LayerNames, 10)
	require.NoError(t, err)
	back, err := routing.ReadLogicalCount(bytes.NewReader(data), routing.LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []int{2, 3, 4, 5, 6, 7, 8, 9}, back.LayerNames)
	assert.Equal(t, 10, back.ModelLayers)
	assert.Equal(t, steps, back.StepLoad)
	_, err = Cut(src.Trace, 0)
	assert.ErrorContains(t, err, "0 tokens per step")
}
