package main

import (
	"cmp"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestVLLMHashCLIRecount: compare --dispatch vllm on a per-token trace with
// sources counts vLLM's hash token by token, and says so: a plan written as
// JSON scores the busiest/mean (mean over layers and worst layer, to 1e-9)
// of a recount of the hash (stackdispatch.VLLMPicker over the plan's
// EPLB maps, each rank's tokens cut into passes of --pass-tokens), for
// passes of 16 tokens and for the whole trace as one pass; with --holdout
// the held-out half is counted too (to the table's 3 decimals). A bad
// --pass-tokens is a usage error naming the flag; two traces fall back to
// the expectation, and the output says so.
func TestVLLMHashCLIRecount(t *testing.T) {
	const nodes, perNode, experts, k, layers, tokens, redundant = 2, 4, 32, 4, 2, 1200, 8
	gpus := nodes * perNode
	dir := t.TempDir()
	trace := recountTrace(t, dir, 36, tokens, layers, k, experts, gpus)
	model := filepath.Join(dir, "model.yaml")
	require.NoError(t, os.WriteFile(model, []byte("name: tiny\nlayers: 2\nexperts: 32\ntop_k: 4\nhidden: 1024\nffn: 512\nbytes_per_activation: 2\n"), 0o644))
	base := []string{"--trace", trace, "--model", model, "--nodes", strconv.Itoa(nodes), "--gpus-per-node", strconv.Itoa(perNode), "--dispatch", "vllm"}
	plan := filepath.Join(dir, "eplb.json")
	code, _, stderr := runCLI(t, append([]string{"plan", "--strategy", "eplb", "--out", plan, "--redundant-slots", strconv.Itoa(redundant), "--time-limit", "5s"}, base...)...)
	require.Equal(t, 0, code, stderr)
	p, err := placement.ReadFile(plan)
	require.NoError(t, err)
	maps, err := p.EPLBMaps()
	require.NoError(t, err)
	src, err := routing.Load(trace, routing.LoadOptions{})
	require.NoError(t, err)
	tr := src.Trace
	recounted := map[int][2]float64{}
	for _, B := range []int{16, 0} {
		mean, worst := hashRecountCLI(t, tr, maps, gpus, 0, tokens, B)
		out := filepath.Join(dir, "cmp.json")
		code, _, stderr := runCLI(t, append([]string{"compare", "--strategies", "eplb", "--plan", plan, "--json", out, "--pass-tokens", strconv.Itoa(B), "--time-limit", "5s"}, base...)...)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, "counted by vLLM's hash", "B=%d: the output says the hash is counted", B)
		got, ok := readCompare(t, out)["file:"+plan]
		require.True(t, ok, "compare has no row for the plan")
		t.Logf("B=%d: compare %.6f / %.6f, recount %.6f / %.6f", B, got[0], got[1], mean, worst)
		assert.InEpsilon(t, mean, got[0], 1e-9, "B=%d: mean busiest/mean, compare vs recount", B)
		assert.InEpsilon(t, worst, got[1], 1e-9, "B=%d: worst layer busiest/mean, compare vs recount", B)
		recounted[B] = [2]float64{mean, worst}
	}
	code, _, stderr = runCLI(t, append([]string{"eval", "--plan", plan, "--pass-tokens", "-1"}, base...)...)
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "--pass-tokens")
	// Held out: both halves are counted, the second from its own rows
	// (its ranks' tokens start a pass at the cut).
	code, stdout, stderr := runCLI(t, append([]string{"compare", "--strategies", "eplb", "--plan", plan, "--holdout", "0.5", "--pass-tokens", "16", "--time-limit", "5s"}, base...)...)
	require.Equal(t, 0, code, stderr)
	hm, hw := hashRecountCLI(t, tr, maps, gpus, tokens/2, tokens, 16)
	row := regexp.MustCompile(`(?m)^\s*file:\S+\s+\S+\s+\S+\s+(\d\.\d{3})\s+(\d\.\d{3})\s`).FindStringSubmatch(stdout)
	require.NotNil(t, row, "no held-out row for the plan in\n%s", stdout)
	gotM, _ := strconv.ParseFloat(row[1], 64)
	gotW, _ := strconv.ParseFloat(row[2], 64)
	t.Logf("held out: compare %.3f / %.3f, recount %.6f / %.6f", gotM, gotW, hm, hw)
	assert.InDelta(t, hm, gotM, 5e-4, "held-out mean busiest/mean, compare vs recount")
	assert.InDelta(t, hw, gotW, 5e-4, "held-out worst layer busiest/mean, compare vs recount")

	// Two traces have no one batch order: the expectation, which is off
	// the recount, and the output says why.
	out := filepath.Join(dir, "even.json")
	code, _, stderr = runCLI(t, append([]string{"compare", "--strategies", "eplb", "--plan", plan, "--json", out, "--trace", trace, "--time-limit", "5s"}, base...)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "the hash's expectation, not the hash token by token: it needs one per-token trace")
	even := readCompare(t, out)["file:"+plan]
	t.Logf("expectation: %.6f / %.6f", even[0], even[1])
	for B, r := range recounted {
		assert.Greater(t, math.Abs(even[0]-r[0]), 1e-4, "B=%d: the recount is off the expectation, or this test proves nothing", B)
	}
}

// readCompare reads compare's JSON: per strategy, mean and worst-layer
// busiest/mean.
func readCompare(t *testing.T, path string) map[string][2]float64 {
	t.Helper()
	var cmp struct {
		Results []struct {
			Strategy string  `json:"strategy"`
			Mean     float64 `json:"mean_balance"`
			Max      float64 `json:"max_balance"`
		} `json:"results"`
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &cmp))
	rows := map[string][2]float64{}
	for _, r := range cmp.Results {
		rows[r.Strategy] = [2]float64{r.Mean, r.Max}
	}
	return rows
}

// hashRecountCLI recounts vLLM's hash over tokens [from, to) of tr (rows
// restarting at from, each rank's tokens cut into passes of B) on the
// plan whose EPLB maps are maps: the busiest/mean averaged over layers
// and in the worst layer.
func hashRecountCLI(t *testing.T, tr *routing.Trace, maps *placement.EPLBMaps, gpus, from, to, B int) (mean, worst float64) {
	t.Helper()
	S := len(maps.Phy2Log[0]) / gpus
	for l := range tr.Layers {
		rt := stackdispatch.Routing{TopK: tr.TopK, Source: tr.Source[from:to]}
		for tok := from; tok < to; tok++ {
			for j := range tr.TopK {
				rt.Experts = append(rt.Experts, int32(tr.At(tok, l, j)))
			}
		}
		replicas := make([][]int32, tr.Experts)
		for e, row := range maps.Log2Phy[l] {
			for _, x := range row[:maps.LogCnt[l][e]] {
				replicas[e] = append(replicas[e], int32(x))
			}
		}
		load, err := stackdispatch.CountTokens(rt, S, gpus, stackdispatch.VLLMPicker(replicas, B))
		require.NoError(t, err)
		busiest := int64(0)
		for _, x := range load {
			busiest = max(busiest, x)
		}
		bal := float64(busiest) / (float64((to-from)*tr.TopK) / float64(gpus))
		mean += bal / float64(tr.Layers)
		worst = max(worst, bal)
	}
	return mean, worst
}

// TestVLLMHashReplayRecount: replay --backend sim --dispatch vllm on the
// bundled Megatron trace (128 FLAME tokens from 2 ranks, with steps) and
// the bundled EPLB plan (8 redundant slots on 8 GPUs) computes every
// GPU's routed tokens of every batch as vLLM's hash sends them, recounted
// here token by token (a token's row: its index among its rank's tokens of
// its step in the batch, modulo --pass-tokens; its copy: VLLMReplica over
// the plan's log2phy row). A cluster costing 1µs a token and nothing per
// expert makes the sim's compute time the token count. The even split,
// replayed under --dispatch even, is off the recount.
func TestVLLMHashReplayRecount(t *testing.T) {
	chdirRoot(t)
	const trace, planFile, gpus = "testdata/serving-stacks/megatron_router_trace", "testdata/plans/stacks/flame.eplb.json", 8
	dir := t.TempDir()
	cluster := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(cluster, []byte("name: tokens\nnodes: 1\ngpus_per_node: 8\nnvlink_gbps: 900\nnic_gbps: 400\ntoken_cost: 1us\n"), 0o644))
	src, err := routing.Load(trace, routing.LoadOptions{})
	require.NoError(t, err)
	tr := src.Trace
	require.NotNil(t, tr.Source, "the bundled trace has source ranks")
	p, err := placement.ReadFileWith(planFile, placement.Layout{GPUs: gpus})
	require.NoError(t, err)
	maps, err := p.EPLBMaps()
	require.NoError(t, err)
	S := len(maps.Phy2Log[0]) / gpus
	recount := func(from, to, pass int) [][]int64 {
		out := make([][]int64, tr.Layers)
		for l := range out {
			out[l] = make([]int64, gpus)
			for tok := from; tok < to; tok++ {
				row := 0
				for u := from; u < tok; u++ {
					if tr.Source[u] == tr.Source[tok] && tr.Step[u] == tr.Step[tok] {
						row++
					}
				}
				if pass > 0 {
					row %= pass
				}
				for k := range tr.TopK {
					e := tr.At(tok, l, k)
					cs := maps.Log2Phy[l][e][:maps.LogCnt[l][e]]
					out[l][cs[stackdispatch.VLLMReplica(int64(row), len(cs))]/S]++
				}
			}
		}
		return out
	}
	replayed := func(args ...string) ([][][]int64, string) {
		out := filepath.Join(dir, "replay.json")
		code, _, stderr := runCLI(t, append([]string{"replay", "--backend", "sim", "--trace", trace, "--plan", planFile, "--model", "flame-moe-290m", "--cluster", cluster, "--json", out}, args...)...)
		require.Equal(t, 0, code, stderr)
		var r struct {
			Plans []struct {
				Measurement struct {
					GPUTime [][][]int64 `json:"gpu_time_ns"`
				} `json:"measurement"`
			} `json:"plans"`
		}
		b, err := os.ReadFile(out)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &r))
		got := r.Plans[0].Measurement.GPUTime
		for _, it := range got {
			for _, ly := range it {
				for g, ns := range ly {
					ly[g] = int64(math.Round(float64(ns) / 1000)) // tokens at 1µs each
				}
			}
		}
		return got, stderr
	}
	for _, tc := range []struct{ batch, pass int }{{0, 0}, {64, 0}, {64, 5}} {
		got, stderr := replayed("--dispatch", "vllm", "--batch-tokens", strconv.Itoa(tc.batch), "--pass-tokens", strconv.Itoa(tc.pass))
		b := cmp.Or(tc.batch, tr.Tokens)
		require.Len(t, got, tr.Tokens/b)
		for i := range got {
			assert.Equal(t, recount(i*b, (i+1)*b, tc.pass), got[i], "batch %d of %d tokens, pass %d", i, b, tc.pass)
		}
		if tc.batch > 0 {
			assert.Contains(t, stderr, "a token's row restarts at every batch", "batch %d", tc.batch)
		}
		even, _ := replayed("--dispatch", "even", "--batch-tokens", strconv.Itoa(tc.batch))
		assert.NotEqual(t, got, even, "batch %d pass %d: the hash is the even split here; the test proves nothing", tc.batch, tc.pass)
	}
}
