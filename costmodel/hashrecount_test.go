package costmodel_test

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// recount32k is the shared DeepSeek-V3-shaped trace (32,768 tokens with
// their source ranks, 1,024 per rank, interleaved; 58 MoE layers, top-8 of
// 256) with EPLB's plan for a deployment (4 nodes × 8 GPUs and 32
// redundant slots, or 8 × 8 and 64), and the busiest/mean costmodel
// models for it under vLLM's dispatch.
type recount32k struct {
	tr       *routing.Trace
	G, S     int
	replicas [][][]int32 // [layer][expert]: slots, ascending
	model    *costmodel.Report
	plan     *placement.Plan
	sc       costmodel.Scenario
}

// recount32kShape is a deployment of the recount tests: a cluster preset
// and the redundant slots per layer.
type recount32kShape struct {
	cluster string
	slots   int
}

var (
	recount32kMu    sync.Mutex
	recount32kTrace *routing.Source
	recount32kData  = map[recount32kShape]*recount32k{}

	shape4x8 = recount32kShape{"4xh100x8", 32}
	shape8x8 = recount32kShape{"8xh100x8", 64}
)

// loadRecount32k reads the shared trace once for the tests of this file
// and plans it for shape, or skips when it is absent (or with -short: it
// reads 30 MB).
func loadRecount32k(t *testing.T, shape recount32kShape) *recount32k {
	t.Helper()
	if testing.Short() {
		t.Skip("reads the 30 MB shared trace")
	}
	path := sharedfiles.Find("shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy")
	if path == "" {
		t.Skip("the shared synthetic trace is absent")
	}
	recount32kMu.Lock()
	defer recount32kMu.Unlock()
	if d := recount32kData[shape]; d != nil {
		return d
	}
	if recount32kTrace == nil {
		src, err := routing.Load(path, routing.LoadOptions{})
		require.NoError(t, err)
		recount32kTrace = src
	}
	d, err := newRecount32k(recount32kTrace, shape)
	require.NoError(t, err)
	recount32kData[shape] = d
	return d
}

func newRecount32k(src *routing.Source, shape recount32kShape) (*recount32k, error) {
	c, err := costmodel.ClusterPreset(shape.cluster)
	if err != nil {
		return nil, err
	}
	m, err := costmodel.ModelPreset("deepseek-v3")
	if err != nil {
		return nil, err
	}
	G := c.GPUs()
	plan, err := baseline.EPLB(src.Stats, G, baseline.EPLBOptions{RedundantSlots: shape.slots, Nodes: c.Nodes, FixDuplicates: true})
	if err != nil {
		return nil, err
	}
	maps, err := plan.EPLBMaps()
	if err != nil {
		return nil, err
	}
	sc := costmodel.Scenario{Stats: src.Stats, Cluster: c, Model: m, Dispatch: placement.DispatchVLLM}
	rep, err := sc.Evaluate(plan)
	if err != nil {
		return nil, err
	}
	d := &recount32k{tr: src.Trace, G: G, S: len(maps.Phy2Log[0]) / G, model: rep, plan: plan, sc: sc, replicas: make([][][]int32, len(maps.Log2Phy))}
	for l := range d.replicas {
		d.replicas[l] = make([][]int32, plan.Experts)
		for e, row := range maps.Log2Phy[l] {
			for _, p := range row[:maps.LogCnt[l][e]] {
				d.replicas[l][e] = append(d.replicas[l][e], int32(p))
			}
		}
	}
	return d, nil
}

// hashGap is a recount's busiest/mean, averaged over layers and in the
// worst layer, and its relative gap to the model's.
type hashGap struct {
	mean, worst       float64
	meanGap, worstGap float64 // recount / model − 1
	layerGapMax       float64 // max over layers of |recount/model − 1|
}

// measure recounts every layer with count (layer l's routed tokens in
// trace order -> tokens per GPU) and compares with the expectation model.
func (d *recount32k) measure(t *testing.T, count func(l int, rt stackdispatch.Routing) ([]int64, error)) hashGap {
	t.Helper()
	return d.measureAgainst(t, d.model, count)
}

// measureAgainst is measure against the model's report model.
func (d *recount32k) measureAgainst(t *testing.T, model *costmodel.Report, count func(l int, rt stackdispatch.Routing) ([]int64, error)) hashGap {
	t.Helper()
	tr := d.tr
	require.NotNil(t, tr)
	require.NotNil(t, tr.Source, "the trace's sources (ds3-prefill4096-32k.source.npy)")
	L, K := tr.Layers, tr.TopK
	require.Len(t, model.Layers, L)
	var r hashGap
	for l := range L {
		rt := stackdispatch.Routing{TopK: K, Source: tr.Source, Experts: make([]int32, 0, tr.Tokens*K)}
		for tok := range tr.Tokens {
			for j := range K {
				rt.Experts = append(rt.Experts, int32(tr.At(tok, l, j)))
			}
		}
		load, err := count(l, rt)
		require.NoError(t, err)
		total, busiest := int64(0), int64(0)
		for _, x := range load {
			total += x
			busiest = max(busiest, x)
		}
		require.Equal(t, int64(tr.Tokens*K), total, "layer %d: every routed pair counted once", l)
		bal := float64(busiest) / (float64(total) / float64(d.G))
		r.mean += bal / float64(L)
		r.worst = max(r.worst, bal)
		r.layerGapMax = max(r.layerGapMax, math.Abs(bal/model.Layers[l].Balance-1))
	}
	r.meanGap, r.worstGap = r.mean/model.MeanBalance-1, r.worst/model.MaxBalance-1
	return r
}

func (d *recount32k) log(t *testing.T, name string, r hashGap) {
	t.Helper()
	d.logAgainst(t, d.model, name, r)
}

func (d *recount32k) logAgainst(t *testing.T, model *costmodel.Report, name string, r hashGap) {
	t.Helper()
	t.Logf("%-34s recount busiest/mean %.5f (%+.3f%% vs model %.5f), worst layer %.5f (%+.3f%% vs %.5f), largest layer gap %.3f%%",
		name, r.mean, 100*r.meanGap, model.MeanBalance, r.worst, 100*r.worstGap, model.MaxBalance, 100*r.layerGapMax)
}

// TestVLLMHashRecount32k is target 4 of the dispatch issue: under vLLM's
// hash dispatch, the busiest/mean costmodel models equals a token-by-token
// recount (stackdispatch.VLLMPicker: each rank's tokens in trace order, cut
// into forward passes of B tokens per rank) within 0.5 %. The trace is
// 4096-token prefill steps on 32 ranks, so B = 4096/32 = 128 tokens per
// rank and pass is the main reading; B = 4096 (each rank a 4096-token
// prefill of its own, so each rank's 1,024 tokens are one pass) the other.
//
// With the trace's token order attached (routing.Trace.TokenOrder(B)),
// costmodel counts the hash itself (every token's row and copy), so the
// model equals the recount in every layer; the test holds it to 1e-9.
// Without it costmodel falls back to the hash's expectation, the even
// split, which is logged here with the floor a model exact in expectation
// cannot beat (drawing each token's copy uniformly at random). Measured
// 2026-12-07: the expectation is 1.24 % (B = 128) and 0.65 % (B = 4096)
// below the recount averaged over layers, the uniform draw 0.70 %; the
// counted model 0.000 % in both.
//
// The same on 8 nodes × 8 GPUs with 64 redundant slots, where the trace's
// 32 source ranks are half of the deployment's and the other half send
// nothing (measured 2026-12-08: the expectation 1.99 % (B = 128) and
// 1.21 % (B = 4096) below the recount, the counted model 0.000 %).
func TestVLLMHashRecount32k(t *testing.T) {
	for _, shape := range []recount32kShape{shape4x8, shape8x8} {
		t.Run(shape.cluster, func(t *testing.T) { testVLLMHashRecount(t, loadRecount32k(t, shape)) })
	}
}

func testVLLMHashRecount(t *testing.T, d *recount32k) {
	uniform := d.measure(t, func(l int, rt stackdispatch.Routing) ([]int64, error) {
		rng := rand.New(rand.NewPCG(uint64(l), 99))
		return stackdispatch.CountTokens(rt, d.S, d.G, func(_ int32, _ int64, _ int, e int32) int32 {
			return d.replicas[l][e][rng.IntN(len(d.replicas[l][e]))]
		})
	})
	d.log(t, "uniform random copy per token", uniform)
	for _, B := range []int{128, 4096} {
		count := func(l int, rt stackdispatch.Routing) ([]int64, error) {
			return stackdispatch.CountTokens(rt, d.S, d.G, stackdispatch.VLLMPicker(d.replicas[l], B))
		}
		r := d.measure(t, count)
		d.log(t, "vllm hash vs expectation, B="+strconv.Itoa(B), r)
		assert.Greater(t, r.meanGap, 0.0, "B=%d: the even expectation lies below the per-token choice's busiest GPU", B)
		sc := d.sc
		sc.Stats = d.sc.Stats.Clone()
		var err error
		sc.Stats.Order, err = d.tr.TokenOrder(B)
		require.NoError(t, err)
		require.NoError(t, costmodel.HashOrder(sc.Stats, d.G))
		counted, err := sc.Evaluate(d.plan)
		require.NoError(t, err)
		r = d.measureAgainst(t, counted, count)
		d.logAgainst(t, counted, "vllm hash vs counted model, B="+strconv.Itoa(B), r)
		assert.InDelta(t, 0, r.meanGap, 1e-9, "B=%d: mean busiest/mean, recount vs counted model", B)
		assert.InDelta(t, 0, r.worstGap, 1e-9, "B=%d: worst layer busiest/mean, recount vs counted model", B)
		assert.InDelta(t, 0, r.layerGapMax, 1e-9, "B=%d: every layer's busiest/mean, recount vs counted model", B)
	}
}

// TestTRTLLMRecount32k: TensorRT-LLM's routing kernel
// (stackdispatch.CountTRTLLM) recounted on the same trace and plan, against
// the even model (its expectation). With attention DP (the kernel offsets
// each rank's round robin by its rank) every copy gets its share to within
// an entry per block, and the model agrees within 0.5 % in the mean and in
// the worst layer (measured 2026-12-07: +0.05 % and +0.04 %, B = 128). Without
// attention DP every rank starts its round robin at copy 0, so the first
// copies of odd counts pile up: measured +2.2 % mean, +3.1 % worst (logged,
// not asserted: it is the stack's behaviour, not the model's error to fix
// here).
func TestTRTLLMRecount32k(t *testing.T) {
	d := loadRecount32k(t, shape4x8)
	for _, tc := range []struct {
		B  int
		dp bool
	}{{128, true}, {4096, true}, {128, false}} {
		r := d.measure(t, func(l int, rt stackdispatch.Routing) ([]int64, error) {
			return stackdispatch.CountTRTLLM(rt, d.replicas[l], d.S, d.G, tc.B, tc.dp)
		})
		name := "trtllm, B=" + strconv.Itoa(tc.B)
		if tc.dp {
			name += ", attention DP"
		} else {
			name += ", no attention DP"
		}
		d.log(t, name, r)
		if tc.dp {
			assert.InDelta(t, 0, r.meanGap, 0.005, "%s: mean busiest/mean, recount vs model", name)
			assert.InDelta(t, 0, r.worstGap, 0.005, "%s: worst layer busiest/mean, recount vs model", name)
		} else {
			assert.Greater(t, r.meanGap, 0.005, "%s: every rank starting at copy 0 overloads the first copies", name)
		}
	}
}
