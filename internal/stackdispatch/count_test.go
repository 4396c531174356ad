package stackdispatch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCountTokensStatic(t *testing.T) {
	// 2 GPUs, 2 slots each: slots 0,1 on GPU 0; 2,3 on GPU 1.
	table := [][][]int32{
		{{0, 1, 3}}, // rank 0: expert 0 -> 0, 1 -> 1, 2 -> 3
		{{2, 1, 3}}, // rank 1: expert 0 -> 2, 1 -> 1, 2 -> 3
	}
	rt := Routing{TopK: 2, Source: []int32{0, 1, 1}, Experts: []int32{0, 2, 0, 1, 2, 0}}
	got, err := CountTokens(rt, 2, 2, StaticPicker(table, 0))
	require.NoError(t, err)
	// token 0 (rank 0): 0->GPU0, 3->GPU1; token 1 (rank 1): 2->GPU1, 1->GPU0; token 2: 3, 2 -> GPU1 twice
	assert.Equal(t, []int64{2, 4}, got)
}

func TestCountTokensVLLM(t *testing.T) {
	replicas := [][]int32{{0, 2, 3}, {1}}
	rt := Routing{TopK: 1, Source: []int32{0, 1, 0, 0, 1}, Experts: []int32{0, 0, 0, 1, 0}}
	got, err := CountTokens(rt, 2, 2, VLLMPicker(replicas, 0))
	require.NoError(t, err)
	// rows per rank: rank 0 tokens 0,1,2 (rows 0,1,2), rank 1 rows 0,1.
	want := make([]int64, 2)
	rows := map[int32]int64{}
	for i, src := range rt.Source {
		e := rt.Experts[i]
		p := replicas[e][VLLMReplica(rows[src], len(replicas[e]))]
		rows[src]++
		want[p/2]++
	}
	assert.Equal(t, want, got)
	// The row restarts every pass: with passes of 1 token every row is 0.
	got, err = CountTokens(rt, 2, 2, VLLMPicker(replicas, 1))
	require.NoError(t, err)
	assert.Equal(t, []int64{5, 0}, got, "row 0 hashes to replica 0 (slot 0) and expert 1 sits in slot 1")
}

func TestCountTRTLLM(t *testing.T) {
	replicas := [][]int32{{0, 3}, {1}, {2}}
	rt := Routing{TopK: 2, Source: []int32{0, 0, 1}, Experts: []int32{0, 1, 0, 2, 0, 0}}
	got, err := CountTRTLLM(rt, replicas, 2, 2, 0, false)
	require.NoError(t, err)
	// rank 0 entries [0,1,0,2] -> slots 0,1,3,2; rank 1 [0,0] -> slots 0,3.
	assert.Equal(t, []int64{3, 3}, got)
	got, err = CountTRTLLM(rt, replicas, 2, 2, 0, true)
	require.NoError(t, err)
	// with attention DP rank 1 starts one copy later: slots 3, 0; same totals.
	assert.Equal(t, []int64{3, 3}, got)
	got, err = CountTRTLLM(rt, replicas, 2, 2, 1, false)
	require.NoError(t, err)
	// one token per pass: every pass is block 0 and starts at copy 0: rank 0
	// [0,1] [0,2] -> slots 0,1,0,2; rank 1 [0,0] -> slots 0,3.
	assert.Equal(t, []int64{4, 2}, got)
}

func TestCountTokensErrors(t *testing.T) {
	table := [][][]int32{{{0}}, {{1}}}
	_, err := CountTokens(Routing{TopK: 1, Source: []int32{2}, Experts: []int32{0}}, 1, 2, StaticPicker(table, 0))
	assert.ErrorContains(t, err, "token 0: source rank 2 outside [0,2)")
	_, err = CountTokens(Routing{TopK: 1, Source: []int32{0}, Experts: []int32{5}}, 1, 2, StaticPicker(table, 0))
	assert.ErrorContains(t, err, "slot -1")
	_, err = CountTokens(Routing{TopK: 2, Source: []int32{0}, Experts: []int32{0}}, 1, 2, StaticPicker(table, 0))
	assert.ErrorContains(t, err, "1 expert ids for 1 tokens of top-k 2")
}
