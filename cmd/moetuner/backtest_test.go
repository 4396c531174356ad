package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/series"
	"github.com/moetuner/moetuner/rebalance"
	"github.com/moetuner/moetuner/routing"
)

// flameSeries writes the FLAME trace cut into 16 steps of 64 tokens as a
// logical_count [16][10][64] file (decoder layers 0-1 dense) and returns
// its path and steps.
func flameSeries(t *testing.T) (string, [][][]float64) {
	t.Helper()
	src, err := routing.Load("testdata/flame-moe-290m/trace.jsonl", routing.LoadOptions{NoPatterns: true})
	require.NoError(t, err)
	steps, err := series.Cut(src.Trace, 64)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "flame-steps.json")
	require.NoError(t, series.WriteLogicalCount(path, steps, src.Stats.LayerNames, 10))
	return path, steps
}

// sglangPlan reads an SGLang physical_to_logical_map by hand: rows 2..9
// are the MoE layers, slot p on GPU p/(P/8).
func sglangPlan(t *testing.T, path string) [][]int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Map [][]int `json:"physical_to_logical_map"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Len(t, doc.Map, 10, path)
	return doc.Map[2:]
}

// parOf is the test's own recount: busiest/mean GPU load per layer, an
// expert's load split evenly over its copies, averaged over layers.
func parOf(rows [][]int, gpus int, load [][]float64) float64 {
	sum := 0.0
	for l, row := range rows {
		per := len(row) / gpus
		copies := map[int]float64{}
		for _, e := range row {
			copies[e]++
		}
		gl := make([]float64, gpus)
		tot := 0.0
		for p, e := range row {
			gl[p/per] += load[l][e] / copies[e]
		}
		for _, v := range gl {
			tot += v
		}
		sum += slices.Max(gl) / (tot / float64(gpus))
	}
	return sum / float64(len(rows))
}

// TestBacktestPlansRescored: backtest on the FLAME series; the placements
// it writes to --plans-dir, read back by hand and re-scored by the test's
// own PAR count on the steps each is in force, give the per-step PAR of
// the JSON and the mean PAR of the printed table; consecutive files differ
// in exactly the slots the JSON says moved. Catches plans written out of
// step with the ones scored, a file name off by one rebalance, and a
// table that prints another number than the run computed.
func TestBacktestPlansRescored(t *testing.T) {
	chdirRoot(t)
	trace, steps := flameSeries(t)
	dir := t.TempDir()
	plans, jsonOut := filepath.Join(dir, "plans"), filepath.Join(dir, "bt.json")
	code, stdout, stderr := runCLI(t, "backtest", "--trace", trace, "--gpus-per-node", "8", "--redundant-slots", "8",
		"--every", "2,4", "--first-window", "4", "--max-moves", "8", "--json", jsonOut, "--plans-dir", plans, "--quiet")
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(jsonOut)
	require.NoError(t, err)
	var res rebalance.BacktestResult
	require.NoError(t, json.Unmarshal(data, &res))
	require.Equal(t, 16, res.Steps)
	require.Equal(t, 4, res.FirstStep)
	require.Len(t, res.Policies, 7)
	assert.Contains(t, stdout, "recommendation: ")
	for _, p := range res.Policies {
		sub := filepath.Join(plans, strings.ReplaceAll(p.Name, "/", "-"))
		files, err := filepath.Glob(filepath.Join(sub, "step-*.sglang.json"))
		require.NoError(t, err)
		require.Len(t, files, len(p.Events), p.Name)
		slices.Sort(files)
		var starts []int
		var maps [][][]int
		for i, f := range files {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "step-"), ".sglang.json"))
			require.NoError(t, err)
			starts = append(starts, n)
			maps = append(maps, sglangPlan(t, f))
			if i > 0 {
				changed := 0
				for l := range maps[i] {
					for s := range maps[i][l] {
						if maps[i][l][s] != maps[i-1][l][s] {
							changed++
						}
					}
				}
				assert.Equal(t, p.Events[i].MovedSlots, changed, "%s %s", p.Name, filepath.Base(f))
			}
		}
		mean := 0.0
		for s := res.FirstStep; s < res.Steps; s++ {
			k := 0
			for k+1 < len(starts) && starts[k+1] <= s {
				k++
			}
			got := parOf(maps[k], 8, steps[s])
			assert.InDelta(t, got, p.PAR[s-res.FirstStep], 1e-12, "%s step %d", p.Name, s)
			mean += got / float64(res.Steps-res.FirstStep)
		}
		assert.InDelta(t, mean, p.MeanPAR, 1e-12, p.Name)
		row := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(p.Name) + `\s.*$`).FindString(stdout)
		require.NotEmpty(t, row, p.Name)
		assert.Contains(t, row, fmt.Sprintf(" %.4f ", mean), p.Name)
	}
}

// TestBacktestTokensPerStep: a per-token trace needs --tokens-per-step,
// and with it gives the same run as the series file cut the same way.
func TestBacktestTokensPerStep(t *testing.T) {
	chdirRoot(t)
	trace, _ := flameSeries(t)
	args := []string{"--gpus-per-node", "8", "--redundant-slots", "8", "--every", "4", "--policies", "static,rebalance", "--quiet"}
	code, _, stderr := runCLI(t, append([]string{"backtest", "--trace", "testdata/flame-moe-290m/trace.jsonl"}, args...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "trace.jsonl: a per-token trace without step ids; pass --tokens-per-step N")
	code, cut, stderr := runCLI(t, append([]string{"backtest", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--tokens-per-step", "64"}, args...)...)
	require.Equal(t, 0, code, stderr)
	code, file, stderr := runCLI(t, append([]string{"backtest", "--trace", trace}, args...)...)
	require.Equal(t, 0, code, stderr)
	strip := regexp.MustCompile(`\s*\S+(ms|µs|s)\s*$`) // planner wall time, last column
	lines := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			out = append(out, strip.ReplaceAllString(l, ""))
		}
		return out
	}
	assert.Equal(t, lines(file), lines(cut))
}

func TestBacktestUsageErrors(t *testing.T) {
	chdirRoot(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"backtest"}, 2, "no --trace given"},
		{[]string{"backtest", "--trace", "x", "--every", "0"}, 2, "--every \"0\""},
		{[]string{"backtest", "--trace", "x", "--policies", "static,magic"}, 2, "unknown policy \"magic\""},
		{[]string{"backtest", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--tokens-per-step", "64", "--redundant-slots", "3"}, 1, "64 experts + 3 redundant slots per layer do not divide evenly over 8 GPUs"},
		{[]string{"backtest", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--tokens-per-step", "512", "--every", "4"}, 1, "the series has 2 steps and the first plan needs 4"},
	} {
		code, _, stderr := runCLI(t, c.args...)
		assert.Equal(t, c.code, code, c.args)
		assert.Contains(t, stderr, c.want, c.args)
	}
}

// TestBacktestSeveralDumps: dumps given one after the other are one
// series (two [steps][layers][experts] dumps, or one [layers][experts]
// dump per step, give the table of the single file), and
// --steps-per-window adds up consecutive steps.
func TestBacktestSeveralDumps(t *testing.T) {
	chdirRoot(t)
	whole, steps := flameSeries(t)
	dir := t.TempDir()
	ids := []int{2, 3, 4, 5, 6, 7, 8, 9}
	first, second := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	require.NoError(t, series.WriteLogicalCount(first, steps[:7], ids, 10))
	require.NoError(t, series.WriteLogicalCount(second, steps[7:], ids, 10))
	perStep := []string{}
	for i, st := range steps {
		p := filepath.Join(dir, fmt.Sprintf("step%02d.json", i))
		s := routing.StatsFromLoad(st, 6)
		s.LayerNames, s.ModelLayers = ids, 10
		var buf bytes.Buffer
		require.NoError(t, routing.WriteStats(&buf, s, routing.StatsLogicalCount))
		require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
		perStep = append(perStep, "--trace", p)
	}
	args := []string{"--gpus-per-node", "8", "--redundant-slots", "8", "--every", "4", "--policies", "eplb,rebalance", "--quiet"}
	strip := regexp.MustCompile(`\s*\S+(ms|µs|s)\s*$`)
	table := func(extra ...string) string {
		code, out, stderr := runCLI(t, append(append([]string{"backtest"}, extra...), args...)...)
		require.Equal(t, 0, code, stderr)
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			lines = append(lines, strip.ReplaceAllString(l, ""))
		}
		return strings.Join(lines, "\n")
	}
	want := table("--trace", whole)
	assert.Equal(t, want, table("--trace", first, "--trace", second))
	assert.Equal(t, want, table(perStep...))
	jsonOut := filepath.Join(dir, "coarse.json")
	table("--trace", whole, "--steps-per-window", "2", "--json", jsonOut)
	data, err := os.ReadFile(jsonOut)
	require.NoError(t, err)
	var res rebalance.BacktestResult
	require.NoError(t, json.Unmarshal(data, &res))
	assert.Equal(t, 8, res.Steps)
}

// TestBacktestEPLBAsCompareDeals: on a series whose every step is the same
// load (the FLAME trace's 16 steps added up), EPLB's plan never changes
// and, under SGLang's static tables, every step's balance as dealt is
// compare's eplb row on that load, which compare deals as init_by_eplb;
// the plan backtest writes, read back by eval (a file: init_by_mapping),
// balances otherwise, so a backtest that dealt EPLB as a loaded map would
// fail. The first window is 4 steps, so EPLB sees the load times 4, an
// exact scaling.
func TestBacktestEPLBAsCompareDeals(t *testing.T) {
	chdirRoot(t)
	src, err := routing.Load("testdata/flame-moe-290m/trace.jsonl", routing.LoadOptions{NoPatterns: true})
	require.NoError(t, err)
	load := src.Stats.Load
	dir := t.TempDir()
	seriesPath, onePath := filepath.Join(dir, "same.json"), filepath.Join(dir, "one.json")
	same := make([][][]float64, 8)
	for i := range same {
		same[i] = load
	}
	require.NoError(t, series.WriteLogicalCount(seriesPath, same, src.Stats.LayerNames, 10))
	require.NoError(t, series.WriteLogicalCount(onePath, [][][]float64{load}, src.Stats.LayerNames, 10))
	shape := []string{"--nodes", "2", "--gpus-per-node", "4", "--redundant-slots", "40", "--quiet"}
	for _, d := range []string{"sglang-static", "sglang-static-node-narrow"} {
		t.Run(d, func(t *testing.T) {
			sub := filepath.Join(dir, d)
			btJSON, cmpJSON, evJSON, plans := filepath.Join(sub, "bt.json"), filepath.Join(sub, "cmp.json"), filepath.Join(sub, "ev.json"), filepath.Join(sub, "plans")
			code, stdout, stderr := runCLI(t, append([]string{"backtest", "--trace", seriesPath, "--every", "4", "--first-window", "4", "--policies", "eplb", "--eplb", "global",
				"--dispatch", d, "--json", btJSON, "--plans-dir", plans}, shape...)...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stdout, "eplb/4 [init_by_eplb]")
			assert.Contains(t, stdout, "[init_by_eplb]: dealt as SGLang's init_by_eplb")
			code, _, stderr = runCLI(t, append([]string{"compare", "--trace", onePath, "--strategies", "eplb", "--dispatch", d, "--json", cmpJSON}, shape...)...)
			require.Equal(t, 0, code, stderr)
			code, _, stderr = runCLI(t, "eval", "--trace", onePath, "--plan", filepath.Join(plans, "eplb-4", "step-000004.sglang.json"), "--dispatch", d, "--json", evJSON, "--nodes", "2", "--gpus-per-node", "4", "--quiet")
			require.Equal(t, 0, code, stderr)
			var bt rebalance.BacktestResult
			var cmp struct {
				Results []struct {
					Init string  `json:"sglang_init"`
					Mean float64 `json:"mean_balance"`
				} `json:"results"`
			}
			var ev struct{ MeanBalance float64 }
			for path, v := range map[string]any{btJSON: &bt, cmpJSON: &cmp, evJSON: &ev} {
				data, err := os.ReadFile(path)
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal(data, v), path)
			}
			require.Len(t, bt.Policies, 1)
			require.Len(t, cmp.Results, 1)
			require.Equal(t, "init_by_eplb", cmp.Results[0].Init)
			want := cmp.Results[0].Mean
			p := bt.Policies[0]
			require.Len(t, p.Balance, 4)
			for i, v := range p.Balance {
				assert.InDelta(t, want, v, 1e-9, "step %d", 4+i)
			}
			t.Logf("%s: backtest's eplb %.6f, compare's init_by_eplb %.6f, the written plan as a file (init_by_mapping) %.6f", d, p.MeanBalance, want, ev.MeanBalance)
			assert.Greater(t, math.Abs(ev.MeanBalance-want), 1e-4, "init_by_mapping deals this load as init_by_eplb: the test cannot tell them apart")
		})
	}
}
