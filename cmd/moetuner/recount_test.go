package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recountTrace writes dir/t.npy, a per-token trace of tokens tokens over
// layers MoE layers of top-k ids among experts, and dir/t.source.npy, each
// token's source rank among gpus. Loads are skewed (Zipf-like weights,
// permuted per layer) and so are the sources (some ranks send several
// times what others do), so that where the deal lands matters.
func recountTrace(t *testing.T, dir string, seed uint64, tokens, layers, k, experts, gpus int) string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	w := make([][]float64, layers)
	for l := range w {
		w[l] = make([]float64, experts)
		for i, e := range r.Perm(experts) {
			w[l][e] = 1 / math.Pow(float64(i+1), 1.1)
		}
	}
	srcW := make([]float64, gpus)
	for g := range srcW {
		srcW[g] = 1 + 3*r.Float64()
	}
	pick := func(ws []float64) int {
		tot := 0.0
		for _, x := range ws {
			tot += x
		}
		u := r.Float64() * tot
		for i, x := range ws {
			if u -= x; u < 0 {
				return i
			}
		}
		return len(ws) - 1
	}
	ids := make([]int64, 0, tokens*layers*k)
	src := make([]int64, tokens)
	for tok := range tokens {
		src[tok] = int64(pick(srcW))
		for l := range layers {
			seen := map[int]bool{}
			for len(seen) < k {
				e := pick(w[l])
				if !seen[e] {
					seen[e] = true
					ids = append(ids, int64(e))
				}
			}
		}
	}
	trace := filepath.Join(dir, "t.npy")
	require.NoError(t, os.WriteFile(trace, npyFile("<i2", []int{tokens, layers, k}, ids), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "t.source.npy"), npyFile("<i4", []int{tokens}, src), 0o644))
	return trace
}

// recount is what scripts/recount_plan.py --json prints.
type recount struct {
	Mean    float64   `json:"mean_balance"`
	Max     float64   `json:"max_balance"`
	Layers  []float64 `json:"layers"`
	Busiest []float64 `json:"busiest_tokens"`
}

// runRecount runs scripts/recount_plan.py on trace and plan under dispatch.
func runRecount(t *testing.T, py, trace, plan string, gpus, perNode int, dispatch string) recount {
	t.Helper()
	cmd := exec.Command(py, filepath.Join("..", "..", "scripts", "recount_plan.py"), trace, plan,
		"--gpus", strconv.Itoa(gpus), "--gpus-per-node", strconv.Itoa(perNode), "--dispatch", dispatch, "--json")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("recount_plan.py %s: %v\n%s", dispatch, err, ee.Stderr)
	}
	require.NoError(t, err)
	var rc recount
	require.NoError(t, json.Unmarshal(out, &rc), "%s", out)
	return rc
}

// evalLayers reads eval's table: per layer, the busiest GPU's tokens and
// busiest/mean (three decimals).
func evalLayers(t *testing.T, stdout string) (busiest, balance []float64) {
	t.Helper()
	row := regexp.MustCompile(`(?m)^\s+(\d+)\s+(\d+)\s+(\d+\.\d+)\s`)
	for _, m := range row.FindAllStringSubmatch(stdout, -1) {
		b, _ := strconv.ParseFloat(m[2], 64)
		r, _ := strconv.ParseFloat(m[3], 64)
		busiest, balance = append(busiest, b), append(balance, r)
	}
	return busiest, balance
}

// sglangStaticTrees are the --dispatch names of SGLang's static table.
var sglangStaticTrees = []string{"sglang-static", "sglang-static-node", "sglang-static-node-narrow", "sglang-static-gpu-only"}

// checkSGLangRecount plans (joint and EPLB) under every tree of SGLang's
// static table on a skewed trace with sources, writes each plan as SGLang
// JSON, and requires eval's and compare's busiest/mean to equal an
// independent recount (scripts/recount_plan.py: SGLang's table built with
// Python's own random from every row of the written map, every token sent
// whole to its rank's entry). decoderLayers is the model's decoder-layer
// count: more than the trace's MoE layers puts dense rows (SGLang's trivial
// map) before them in the file.
func checkSGLangRecount(t *testing.T, decoderLayers int) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	const nodes, perNode, experts, k, layers, tokens, redundant = 2, 4, 32, 4, 3, 3000, 8
	gpus := nodes * perNode
	dir := t.TempDir()
	trace := recountTrace(t, dir, 11, tokens, layers, k, experts, gpus)
	model := filepath.Join(dir, "model.yaml")
	require.NoError(t, os.WriteFile(model, fmt.Appendf(nil,
		"name: tiny\nlayers: %d\ndecoder_layers: %d\nexperts: %d\ntop_k: %d\nhidden: 1024\nffn: 512\nbytes_per_activation: 2\n",
		layers, decoderLayers, experts, k), 0o644))
	base := []string{"--trace", trace, "--model", model, "--nodes", strconv.Itoa(nodes), "--gpus-per-node", strconv.Itoa(perNode), "--quiet"}
	for _, d := range sglangStaticTrees {
		t.Run(d, func(t *testing.T) {
			args := append(append([]string{}, base...), "--dispatch", d, "--redundant-slots", strconv.Itoa(redundant))
			var plans []string
			for _, s := range []string{"joint", "eplb"} {
				out := filepath.Join(dir, d+"-"+s+".json")
				code, _, stderr := runCLI(t, append([]string{"plan", "--strategy", s, "--format", "sglang", "--out", out, "--time-limit", "2s"}, args...)...)
				require.Equal(t, 0, code, stderr)
				var doc struct {
					M [][]int `json:"physical_to_logical_map"`
				}
				b, err := os.ReadFile(out)
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal(b, &doc))
				require.Len(t, doc.M, decoderLayers, "one map row per decoder layer")
				plans = append(plans, out)
			}
			cmpOut := filepath.Join(dir, d+"-compare.json")
			code, _, stderr := runCLI(t, append([]string{"compare", "--strategies", "eplb", "--plan", plans[0], "--plan", plans[1], "--json", cmpOut, "--time-limit", "2s"}, args...)...)
			require.Equal(t, 0, code, stderr)
			var cmp struct {
				Dispatch string `json:"dispatch"`
				Results  []struct {
					Strategy string  `json:"strategy"`
					Mean     float64 `json:"mean_balance"`
					Max      float64 `json:"max_balance"`
				} `json:"results"`
			}
			b, err := os.ReadFile(cmpOut)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &cmp))
			assert.Equal(t, d, cmp.Dispatch)
			rows := map[string][2]float64{}
			for _, r := range cmp.Results {
				rows[r.Strategy] = [2]float64{r.Mean, r.Max}
			}
			for _, plan := range plans {
				want := runRecount(t, py, trace, plan, gpus, perNode, d)
				got, ok := rows["file:"+plan]
				require.True(t, ok, "compare has no row for %s: %v", plan, rows)
				t.Logf("%s %s: compare %.6f / %.6f, recount %.6f / %.6f", d, filepath.Base(plan), got[0], got[1], want.Mean, want.Max)
				assert.InEpsilon(t, want.Mean, got[0], 1e-9, "%s: mean busiest/mean, compare vs recount", plan)
				assert.InEpsilon(t, want.Max, got[1], 1e-9, "%s: worst layer busiest/mean, compare vs recount", plan)
				code, stdout, stderr := runCLI(t, "eval", "--plan", plan, "--trace", trace, "--model", model, "--nodes", strconv.Itoa(nodes), "--gpus-per-node", strconv.Itoa(perNode), "--dispatch", d, "--quiet")
				require.Equal(t, 0, code, stderr)
				busiest, bal := evalLayers(t, stdout)
				require.Len(t, busiest, layers, stdout)
				assert.Equal(t, want.Busiest, busiest, "%s: eval's busiest GPU tokens per layer vs recount", plan)
				for l := range bal {
					assert.InDelta(t, want.Layers[l], bal[l], 5e-4, "%s: eval's layer %d busiest/mean vs recount", plan, l)
				}
			}
		})
	}
}

// TestSGLangPlanRecount: a plan written as SGLang JSON, scored by eval and
// compare under each tree of SGLang's static table, has the busiest/mean
// (mean over layers and worst layer, to 1e-9) and the busiest GPU's tokens
// of an independent recount in Python. A model whose table differs from
// SGLang's in one deal, whose loads are an expectation (static-mean), or
// whose per-source volumes are not the trace's exact counts moves the
// busiest GPU and fails.
func TestSGLangPlanRecount(t *testing.T) {
	checkSGLangRecount(t, 3)
}

// TestSGLangPlanRecountDenseRows is TestSGLangPlanRecount for a model with
// dense decoder layers before its MoE layers (DeepSeek-V3 has three): the
// written map has SGLang's trivial rows for them, and SGLang deals those
// rows too (ModelConfigForExpertLocation.num_layers is num_hidden_layers;
// compute_logical_to_rank_dispatch_physical_map walks every row with one
// random.Random(42)), so the deals of the dense rows move the stream the
// MoE rows are dealt from.
func TestSGLangPlanRecountDenseRows(t *testing.T) {
	checkSGLangRecount(t, 5)
}
