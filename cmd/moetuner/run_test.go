package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// chdirRoot runs the test from the repository root, as the README does.
func chdirRoot(t *testing.T) {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(filepath.Join("..", "..")))
	t.Cleanup(func() { os.Chdir(wd) })
}

func TestPlanDefaultsAndEval(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "plan.json")
	code, stdout, stderr := runCLI(t, "plan", "--out", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "joint placement of 32 layers × 8 experts on 4 GPUs")
	assert.Contains(t, stdout, "contiguous")
	first, err := os.ReadFile(out)
	require.NoError(t, err)
	plan, err := placement.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, 4, plan.GPUs)

	// Same inputs, same bytes.
	code, _, stderr = runCLI(t, "plan", "--out", out, "--quiet")
	require.Equal(t, 0, code, stderr)
	second, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, string(first), string(second))

	code, stdout, stderr = runCLI(t, "eval", "--trace", "testdata/mixtral-8x7b/fiddler", "--plan", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "total")

	sg := filepath.Join(dir, "plan.sglang.json")
	code, _, stderr = runCLI(t, "plan", "--strategy", "greedy", "--out", sg, "--quiet")
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(sg)
	require.NoError(t, err)
	assert.Contains(t, string(data), "physical_to_logical_map")
	code, _, stderr = runCLI(t, "eval", "--trace", "testdata/mixtral-8x7b/fiddler", "--plan", sg)
	require.Equal(t, 0, code, stderr)
}

func TestStats(t *testing.T) {
	chdirRoot(t)
	code, stdout, stderr := runCLI(t, "stats", "testdata/flame-moe-290m/trace.jsonl")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "tokens 1024  layers 8  experts 64  top-k 6")
	assert.Contains(t, stdout, "max/mean")
}

// flamePrefix writes the FLAME trace's header and first n tokens to a
// temporary file and returns its path: a work budget (--effort) on the
// whole trace's chain flow costs twice the CPU time.
func flamePrefix(t *testing.T, n int) string {
	t.Helper()
	data, err := os.ReadFile("testdata/flame-moe-290m/trace.jsonl")
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	require.Greater(t, len(lines), n+1, "header and %d tokens", n)
	path := filepath.Join(t.TempDir(), "flame-prefix.jsonl")
	require.NoError(t, os.WriteFile(path, bytes.Join(lines[:n+1], nil), 0o644))
	return path
}

func TestCompareFLAMETwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("solves ILPs")
	}
	chdirRoot(t)
	js := filepath.Join(t.TempDir(), "c.json")
	html := filepath.Join(t.TempDir(), "c.html")
	// A work budget: under a time limit on a loaded machine HiGHS may stop
	// before its root bound, and whether a gap is proven (and plotted)
	// then depends on the load. On the first 256 tokens, to keep it short.
	code, stdout, stderr := runCLI(t, "compare", "--trace", flamePrefix(t, 256), "--nodes", "2", "--gpus-per-node", "4",
		"--flow", "chain", "--effort", "1", "--strategies", "contiguous,greedy,joint", "--json", js, "--report", html)
	require.Equal(t, 0, code, stderr)
	for _, s := range []string{"contiguous", "greedy", "joint", "vs contiguous", "2 nodes × 4 GPUs", "wrote " + html} {
		assert.Contains(t, stdout, s)
	}
	_, err := os.Stat(js)
	assert.NoError(t, err)
	page, err := os.ReadFile(html)
	require.NoError(t, err)
	for _, s := range []string{"<td>contiguous</td>", "<td>greedy</td>", "<td>joint</td>", "flow chain"} {
		assert.Contains(t, string(page), s)
	}
	// 3 plans × (load, GPU traffic, node traffic), busiest/mean,
	// cross-node, and the gap plot when joint proved a gap.
	var res struct {
		Results []jsonResult `json:"results"`
	}
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &res))
	// The worst layer's busiest/mean bounds the mean over layers; FLAME's
	// layers differ, so some strategy's worst lies above its mean.
	spread := false
	for _, r := range res.Results {
		assert.GreaterOrEqual(t, r.MaxBalance, r.MeanBalance, r.Strategy)
		assert.GreaterOrEqual(t, r.MeanBalance, 1.0, r.Strategy)
		spread = spread || r.MaxBalance > r.MeanBalance*(1+1e-6)
	}
	assert.True(t, spread, "max_balance equals mean_balance for every strategy")
	// The count follows what the JSON says was proven: a number, zero
	// included, where a gap or an exact-cost bound exists, null where none
	// does.
	var proven struct {
		Results []struct {
			Gap       *float64 `json:"gap"`
			CostBound *float64 `json:"cost_bound_sec"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(data, &proven))
	want := 11
	for _, r := range proven.Results {
		if r.Gap != nil || (r.CostBound != nil && *r.CostBound > 0) {
			want = 12
		}
	}
	assert.Equal(t, want, strings.Count(string(page), `<img class="plot"`))
}

func TestErrors(t *testing.T) {
	chdirRoot(t)
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no command", nil, 2, "Usage"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"bad flag", []string{"plan", "--nope"}, 2, "flag provided but not defined"},
		{"missing trace", []string{"eval", "--plan", "x.json"}, 2, "no --trace"},
		{"missing file", []string{"stats", "nope.jsonl"}, 1, "nope.jsonl"},
		{"bad strategy", []string{"plan", "--strategy", "magic"}, 2, `invalid value "magic" for flag -strategy: want one of contiguous`},
		{"gpus do not divide", []string{"plan", "--gpus-per-node", "3", "--out", filepath.Join(t.TempDir(), "p.json")}, 1, "do not divide evenly"},
		{"chain without transitions", []string{"plan", "--flow", "chain", "--out", filepath.Join(t.TempDir(), "p.json")}, 1, "per-token trace"},
		{"bad flow", []string{"plan", "--flow", "sideways"}, 2, `invalid value "sideways" for flag -flow: want one of home, chain`},
		{"bad dispatch", []string{"compare", "--trace", "t", "--dispatch", "near"}, 2, `invalid value "near" for flag -dispatch`},
		{"positional plan argument", []string{"plan", "extra"}, 2, "plan takes no positional arguments"},
		{"eval needs plan", []string{"eval", "--trace", "testdata/mixtral-8x7b/fiddler"}, 2, "eval needs --plan FILE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.msg)
		})
	}
}

func TestHelp(t *testing.T) {
	for _, cmd := range []string{"stats", "plan", "eval", "compare"} {
		code, _, stderr := runCLI(t, cmd, "-h")
		assert.Equal(t, 0, code, cmd)
		assert.Contains(t, stderr, "Usage: moetuner "+cmd, cmd)
	}
	code, stdout, _ := runCLI(t, "help")
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "compare")
}

// TestCLIDocMatchesHelp: docs/cli.md copies every command's flags; each
// copy is the command's -h output as it is now, so a flag added or
// reworded without the page fails here.
func TestCLIDocMatchesHelp(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	require.NoError(t, err)
	for _, cmd := range []string{"stats", "plan", "eval", "compare", "replay", "report", "backtest"} {
		code, stdout, stderr := runCLI(t, cmd, "-h")
		require.Equal(t, 0, code, cmd)
		hdr := "### `" + cmd + "`\n\n```\n"
		i := strings.Index(string(doc), hdr)
		require.GreaterOrEqual(t, i, 0, "docs/cli.md has no flags section for %s", cmd)
		rest := string(doc)[i+len(hdr):]
		block := rest[:strings.Index(rest, "```")]
		assert.Equal(t, strings.TrimRight(stdout+stderr, "\n")+"\n", block, "docs/cli.md's copy of `moetuner %s -h` (regenerate it from the help)", cmd)
	}
}

func TestReplicaAndRebalanceFlags(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	fid := "testdata/mixtral-8x7b/fiddler/"
	// EPLB with replicas, written in EPLB's three maps.
	ep := filepath.Join(dir, "p.eplb.json")
	code, _, stderr := runCLI(t, "plan", "--strategy", "eplb", "--redundant-slots", "4", "--out", ep, "--quiet")
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(ep)
	require.NoError(t, err)
	for _, k := range []string{"phy2log", "log2phy", "logcnt"} {
		assert.Contains(t, string(data), k)
	}
	// Joint with replicas; the table certifies the balance gap.
	out := filepath.Join(dir, "joint.json")
	code, stdout, stderr := runCLI(t, "plan", "--redundant-slots", "4", "--out", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "joint")
	// vLLM's single map needs one map for all layers: contiguous works,
	// a per-layer joint plan is refused with advice.
	code, _, stderr = runCLI(t, "plan", "--strategy", "contiguous", "--out", filepath.Join(dir, "c.vllm.json"), "--quiet")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, "plan", "--out", filepath.Join(dir, "j.vllm.json"), "--quiet")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "write per-layer plans in the vllm-map format")
	// Robust over two workloads, then an incremental re-plan from it.
	rob := filepath.Join(dir, "robust.json")
	code, stdout, stderr = runCLI(t, "plan", "--trace", fid+"expert_popularity_college_medicine.json", "--trace", fid+"expert_popularity_machine_learning.json", "--across", "worst", "--out", rob)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "joint")
	code, _, stderr = runCLI(t, "plan", "--trace", fid+"expert_popularity_international_law.json", "--from", rob, "--max-moves", "2", "--out", filepath.Join(dir, "inc.json"), "--quiet")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, "plan", "--trace", fid+"expert_popularity_international_law.json", "--across", "mean", "--out", filepath.Join(dir, "x.json"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "at least two")
}

func TestCompareDeepSeekShared(t *testing.T) {
	chdirRoot(t)
	path := filepath.Join("..", "shared", "traces", "sglang-deepseek-v3-expert-counts", "prefill_in4096.json")
	if _, err := os.Stat(path); err != nil {
		t.Skip("../shared/traces is absent")
	}
	code, stdout, stderr := runCLI(t, "compare", "--trace", path, "--nodes", "4", "--redundant-slots", "32")
	require.Equal(t, 0, code, stderr)
	for _, s := range []string{"contiguous", "eplb", "eplb-hierarchical", "greedy", "joint", "gap"} {
		assert.Contains(t, stdout, s)
	}
}

func TestSplitFlag(t *testing.T) {
	chdirRoot(t)
	out := filepath.Join(t.TempDir(), "p.json")
	code, _, stderr := runCLI(t, "plan", "--redundant-slots", "4", "--split", "optimal", "--out", out, "--quiet")
	require.Equal(t, 0, code, stderr)
	plan, err := placement.ReadFile(out)
	require.NoError(t, err)
	require.NotNil(t, plan.Layers[0].SlotShare)
	code, _, stderr = runCLI(t, "plan", "--split", "sideways")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "want one of even, optimal")
}

// --from keeps the running plan's slot layout for every strategy: without
// --redundant-slots, EPLB and joint plan for the file's 4 redundant slots
// (3 per GPU), and joint changes at most --max-moves of them; a
// --redundant-slots or --slots-per-gpu the file contradicts is refused,
// naming both. Before, EPLB planned for the flags' 2 slots per GPU while
// joint kept the file's 3.
func TestFromKeepsRunningSlots(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	run := filepath.Join(dir, "r.json")
	code, _, stderr := runCLI(t, "plan", "--redundant-slots", "4", "--out", run, "--quiet")
	require.Equal(t, 0, code, stderr)
	running, err := placement.ReadFile(run)
	require.NoError(t, err)
	for _, st := range []string{"eplb", "joint"} {
		out := filepath.Join(dir, st+".json")
		code, _, stderr = runCLI(t, "plan", "--from", run, "--max-moves", "2", "--strategy", st, "--out", out, "--quiet")
		require.Equal(t, 0, code, stderr)
		plan, err := placement.ReadFile(out)
		require.NoError(t, err)
		for l := range plan.Layers {
			require.Equal(t, []int{3, 3, 3, 3}, plan.SlotsPerGPU(l), "%s layer %d", st, l)
			if st == "joint" {
				assert.LessOrEqual(t, placement.ChangedSlots(running.Layers[l], plan.Layers[l]), 2, "layer %d", l)
			}
		}
	}
	// The running plan is a row, and each plan says how much it moves.
	code, stdout, stderr := runCLI(t, "plan", "--from", run, "--max-moves", "2", "--out", filepath.Join(dir, "y.json"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "file:"+run)
	assert.Regexp(t, `joint\*?: changes \d+ slots of the running plan \(--from\), at most [012] in a layer`, stdout)
	assert.Contains(t, stdout, "file: a --plan file or the running plan (--from), scored as it is (no solve).")
	code, stdout, stderr = runCLI(t, "compare", "--from", run, "--strategies", "eplb", "--plan", run)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, 1, strings.Count(stdout, "file:"+run+" "), "the running plan once, also when given as --plan")
	assert.Regexp(t, `eplb: changes \d+ slots of the running plan`, stdout)
	code, _, stderr = runCLI(t, "plan", "--from", run, "--redundant-slots", "8", "--out", filepath.Join(dir, "x.json"), "--quiet")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "has 4 redundant slots per layer (12 slots on 4 GPUs) but --redundant-slots is 8; drop --redundant-slots")
	code, _, stderr = runCLI(t, "plan", "--from", run, "--slots-per-gpu", "4,4,2,2", "--out", filepath.Join(dir, "x.json"), "--quiet")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "has [3 3 3 3] slots per GPU but --slots-per-gpu gives [4 4 2 2]; drop --slots-per-gpu")
	code, _, stderr = runCLI(t, "plan", "--from", run, "--redundant-slots", "4", "--out", filepath.Join(dir, "x.json"), "--quiet")
	assert.Equal(t, 0, code, stderr)
}

func TestHeterogeneousAndSteps(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	// A logical_count file with two steps: --across plans for both.
	steps := filepath.Join(dir, "steps.json")
	require.NoError(t, os.WriteFile(steps, []byte(`{"logical_count": [[[90,10,30,20,5,5,15,25]],[[10,90,20,30,25,15,5,5]]]}`), 0o644))
	code, stdout, stderr := runCLI(t, "plan", "--trace", steps, "--model", "mixtral-8x7b", "--across", "worst", "--out", filepath.Join(dir, "a.json"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "joint")
	// Heterogeneous slots: GPU 0 holds 4 experts, the others 2, 2 and 0+… .
	out := filepath.Join(dir, "h.json")
	code, _, stderr = runCLI(t, "plan", "--slots-per-gpu", "4,2,1,1", "--out", out, "--quiet")
	require.Equal(t, 0, code, stderr)
	plan, err := placement.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, []int{4, 2, 1, 1}, plan.SlotsPerGPU(0))
	code, _, stderr = runCLI(t, "plan", "--slots-per-gpu", "4,2", "--out", out, "--quiet")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "one per GPU")
	// Incremental with a move cost: a huge cost forbids every move.
	code, _, stderr = runCLI(t, "plan", "--from", out, "--slots-per-gpu", "4,2,1,1", "--move-cost", "100", "--out", filepath.Join(dir, "i.json"), "--quiet")
	require.Equal(t, 0, code, stderr)
	again, err := placement.ReadFile(filepath.Join(dir, "i.json"))
	require.NoError(t, err)
	for l := range plan.Layers {
		assert.Equal(t, plan.ExpertGPUs(l), again.ExpertGPUs(l), "layer %d unchanged", l)
	}
}

func TestDispatchLocalFlags(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	fid := "testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json"
	out := filepath.Join(dir, "p.sglang.json")
	dm := filepath.Join(dir, "dispatch.json")
	// Mixtral on 2 nodes × 2 GPUs with 4 redundant slots.
	code, stdout, stderr := runCLI(t, "plan", "--trace", fid, "--nodes", "2", "--gpus-per-node", "2", "--redundant-slots", "4",
		"--dispatch", "local", "--out", out, "--dispatch-map", dm)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "joint")
	var doc struct {
		GPUs int       `json:"num_gpus"`
		Map  [][][]int `json:"logical_to_rank_dispatch_physical_map"`
	}
	data, err := os.ReadFile(dm)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &doc))
	assert.Equal(t, 4, doc.GPUs)
	require.Len(t, doc.Map, 4)
	assert.Len(t, doc.Map[0], 32)
	assert.Len(t, doc.Map[0][0], 8)
	// eval and compare model the same dispatch.
	code, stdout, stderr = runCLI(t, "compare", "--trace", fid, "--nodes", "2", "--gpus-per-node", "2", "--redundant-slots", "4",
		"--dispatch", "local", "--expert-groups", "2", "--strategies", "eplb,eplb-hierarchical,joint", "--time-limit", "5s")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "eplb-hierarchical")

	// replay follows the same dispatch (sim backend: model only).
	code, stdout, stderr = runCLI(t, "replay", "--trace", fid, "--plan", out, "--nodes", "2", "--gpus-per-node", "2", "--dispatch", "local", "--backend", "sim")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "p.sglang.json")

	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"plan", "--trace", fid, "--dispatch-map", dm}, "add --dispatch local", 2},
		{[]string{"plan", "--trace", fid, "--dispatch", "nearest"}, "want one of static, even, local, static-mean, sglang-static", 2},
		{[]string{"plan", "--trace", fid, "--redundant-slots", "4", "--dispatch", "local", "--flow", "chain"}, "home flow only", 1},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		assert.Equal(t, tc.code, code, tc.args)
		assert.Contains(t, stderr, tc.want, tc.args)
	}
}

// TestStatsOut is the acceptance check of stats --out: the SGLang stat
// dump, the two per_token dumps together and the Megatron traces all give
// the same logical_count, with the loads at rows 2-9 and dense rows zero;
// moetuner-format files add up.
func TestStatsOut(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	var ex struct {
		Load [][]float64 `json:"logical_load_moe_layers"`
	}
	b, err := os.ReadFile("testdata/serving-stacks/expected.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ex))
	check := func(t *testing.T, path string) {
		var lc struct {
			Rows [][]float64 `json:"logical_count"`
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &lc))
		require.Len(t, lc.Rows, 10)
		assert.Equal(t, make([]float64, 64), lc.Rows[0], "dense layer 0")
		assert.Equal(t, make([]float64, 64), lc.Rows[1], "dense layer 1")
		assert.Equal(t, ex.Load, lc.Rows[2:])
	}
	vs := "testdata/serving-stacks/"
	for name, args := range map[string][]string{
		"stat":      {vs + "sglang_stat.pt"},
		"per_token": {vs + "sglang_per_token_0.pt", vs + "sglang_per_token_1.pt"},
		"megatron":  {vs + "megatron_router_trace"},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name+".json")
			code, stdout, stderr := runCLI(t, append(append([]string{"stats"}, args...), "--out", out, "--format", "logical-count")...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stdout, "logical_count of 10 rows × 64 experts, MoE layers at rows [2 3 4 5 6 7 8 9]")
			check(t, out)
		})
	}

	a, bb, all := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json"), filepath.Join(dir, "all.json")
	code, _, stderr := runCLI(t, "stats", "--out", a, vs+"megatron_router_trace")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, "stats", vs+"sglang_per_pass_0.pt", vs+"sglang_per_pass_1.pt", "--out", bb)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := runCLI(t, "stats", a, bb, "--out", all)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "source "+a+" (moetuner-stats)")
	var sa, sb, sall struct {
		Load [][]float64 `json:"load"`
	}
	for p, v := range map[string]any{a: &sa, bb: &sb, all: &sall} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, v))
	}
	for l := range sall.Load {
		for e := range sall.Load[l] {
			require.Equal(t, sa.Load[l][e]+sb.Load[l][e], sall.Load[l][e])
		}
	}

	code, _, stderr = runCLI(t, "stats", vs+"sglang_stat.pt", "--format", "logical-count")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--format logical-count needs --out FILE")
	code, _, stderr = runCLI(t, "stats", vs+"sglang_stat.pt", "--format", "csv")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `invalid value "csv" for flag -format`)
}

// TestStatsOutShared runs the acceptance commands on the shared fixtures.
func TestStatsOutShared(t *testing.T) {
	chdirRoot(t)
	shared := filepath.Join("..", "shared", "fixtures", "serving-stacks")
	b, err := os.ReadFile(filepath.Join(shared, "EXPECTED.json"))
	if err != nil {
		t.Skip("shared serving-stack fixtures not present")
	}
	var ex struct {
		Load [][]float64 `json:"logical_load_moe_layers"`
	}
	require.NoError(t, json.Unmarshal(b, &ex))
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"stat":      {filepath.Join(shared, "sglang_stat.pt")},
		"per_token": {filepath.Join(shared, "sglang_per_token_0.pt"), filepath.Join(shared, "sglang_per_token_1.pt")},
		"megatron":  {filepath.Join(shared, "megatron_router_trace") + "/"},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name+".json")
			code, _, stderr := runCLI(t, append(append([]string{"stats"}, args...), "--out", out, "--format", "logical-count")...)
			require.Equal(t, 0, code, stderr)
			var lc struct {
				Rows [][]float64 `json:"logical_count"`
			}
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &lc))
			require.Len(t, lc.Rows, 10)
			assert.Equal(t, ex.Load, lc.Rows[2:10])
			assert.Equal(t, make([]float64, 64), lc.Rows[0])
		})
	}
}

// TestTraceFormatsListEveryReader keeps --trace-format in step with the
// formats routing reads.
func TestTraceFormatsListEveryReader(t *testing.T) {
	want := []string{""}
	for _, f := range routing.Formats {
		want = append(want, string(f))
	}
	assert.Equal(t, want, traceFormats)
}

// TestGPUsNotDividingExperts: three nodes of two GPUs with 8 experts and 4
// redundant slots (2 slots a GPU) have no contiguous layout, yet plan and
// compare work: plan scores round-robin in its place, compare skips it
// with the reason, and asking for contiguous says why it cannot be.
func TestGPUsNotDividingExperts(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	shape := []string{"--nodes", "3", "--gpus-per-node", "2", "--redundant-slots", "4", "--time-limit", "5s"}
	out := filepath.Join(dir, "p.json")
	code, stdout, stderr := runCLI(t, append([]string{"plan", "--out", out}, shape...)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "round-robin")
	assert.Contains(t, stdout, "joint placement of 32 layers × 8 experts on 6 GPUs (3 nodes)")
	plan, err := placement.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, 6, plan.GPUs)
	// eval, replay and report take the slots from the plan file.
	for _, cmd := range [][]string{{"eval"}, {"replay"}, {"report", "--out", filepath.Join(dir, "r.html")}} {
		code, _, stderr = runCLI(t, append(cmd, "--trace", "testdata/mixtral-8x7b/fiddler", "--nodes", "3", "--gpus-per-node", "2", "--plan", out)...)
		assert.Equal(t, 0, code, "%s: %s", cmd[0], stderr)
	}

	code, stdout, stderr = runCLI(t, append([]string{"compare", "--strategies", "contiguous,greedy,eplb,joint"}, shape...)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "greedy")
	assert.Contains(t, stderr, "strategy contiguous: solver: infeasible: contiguous: Megatron's contiguous layout gives every GPU E/G experts, and 8 experts do not divide over 6 GPUs")
	assert.Contains(t, stdout, "eplb")
	assert.Contains(t, stdout, "joint")

	// The default list leaves contiguous out and says so.
	code, stdout, stderr = runCLI(t, append([]string{"compare"}, shape...)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "skipping the contiguous strategy: 8 experts do not divide over 6 GPUs")
	assert.NotContains(t, stderr, "infeasible")
	assert.Contains(t, stdout, "round-robin")

	code, _, stderr = runCLI(t, append([]string{"plan", "--strategy", "contiguous", "--out", filepath.Join(dir, "c.json")}, shape...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "8 experts do not divide over 6 GPUs; use round-robin, or a GPU count that divides 8")
	assert.NoFileExists(t, filepath.Join(dir, "c.json"))

	code, _, stderr = runCLI(t, "plan", "--redundant-slots", "-6", "--out", filepath.Join(dir, "n.json"))
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--redundant-slots -6: want 0 or more")
}

// TestMaxImbalanceFlag: --max-imbalance refuses values below 1 as a usage
// error, caps every layer's balance where a plan under it exists, and
// where none does fails in the command line's words, writing no file.
func TestMaxImbalanceFlag(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	for _, bad := range []string{"0.9", "-1", "+Inf"} {
		code, _, stderr := runCLI(t, "plan", "--max-imbalance", bad, "--out", filepath.Join(dir, "bad.json"))
		assert.Equal(t, 2, code, bad)
		assert.Contains(t, stderr, "--max-imbalance "+bad+": want 0 (no cap) or a busiest/mean ratio of at least 1", bad)
	}
	// Mixtral on 4 GPUs without copies: two experts a GPU keep 17 layers
	// above a cap of 1.001 on any plan, which is refused before the
	// search; with one redundant slot per GPU a cap of 1.02 is met.
	// A work budget: whether a search meets a cap or needs the repair
	// must not depend on how loaded the machine is.
	shape := []string{"--nodes", "1", "--gpus-per-node", "4", "--effort", "1"}
	out := filepath.Join(dir, "tight.json")
	code, _, stderr := runCLI(t, append([]string{"plan", "--max-imbalance", "1.001", "--out", out}, shape...)...)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "at least 17 of 32 layers cannot be brought under --max-imbalance 1.001 by any plan with these slots")
	assert.Contains(t, stderr, "raise --max-imbalance to at least 1.0960")
	assert.Contains(t, stderr, "--redundant-slots")
	assert.NotContains(t, stderr, "Problem.")
	assert.NoFileExists(t, out)

	out = filepath.Join(dir, "capped.json")
	code, _, stderr = runCLI(t, append([]string{"plan", "--max-imbalance", "1.02", "--redundant-slots", "4", "--out", out}, shape...)...)
	require.Equal(t, 0, code, stderr)
	// compare's note on the repaired plan names the flag.
	// FLAME's chain flow on 2 nodes trades balance for fewer cross-node
	// transitions, so its search's plan has layers above 1.015 that the
	// repair brings under it.
	code, stdout, stderr := runCLI(t, "compare", "--trace", flamePrefix(t, 256), "--strategies", "joint", "--max-imbalance", "1.015",
		"--flow", "chain", "--nodes", "2", "--gpus-per-node", "4", "--effort", "1")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `joint\*: .*\d+ layers? repaired to meet --max-imbalance`, stdout, stderr)
	plan, err := placement.ReadFile(out)
	require.NoError(t, err)
	// Recount each layer's busiest/mean from the file and the trace,
	// copies splitting evenly (the default dispatch).
	src, err := routing.Load(DefaultTrace, routing.LoadOptions{StatsOnly: true})
	require.NoError(t, err)
	require.Len(t, plan.Layers, src.Stats.Layers)
	for l, lp := range plan.Layers {
		copies := map[routing.Expert]int{}
		for _, e := range lp.SlotExpert {
			copies[e]++
		}
		tok := make([]float64, plan.GPUs)
		sum := 0.0
		for s, e := range lp.SlotExpert {
			v := src.Stats.Load[l][e] / float64(copies[e])
			tok[lp.SlotGPU[s]] += v
			sum += v
		}
		assert.LessOrEqual(t, slices.Max(tok)/(sum/float64(plan.GPUs)), 1.02*(1+1e-9), "layer %d", l)
	}
}
