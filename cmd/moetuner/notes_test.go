package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

// TestNotes: when the statistics sample the paths (a loose --path-error
// on the FLAME trace's 1024 tokens), stats, eval, plan and compare print
// the note once on stderr as "moetuner: note: ...", never on stdout nor
// in --json; --quiet silences it, --path-error 0 keeps every path (no
// note), and a stats file written with --out carries the sample and the
// note. It catches a note printed twice (once per file merged), printed
// to stdout or into JSON, or lost on the way from routing to the terminal.
func TestNotes(t *testing.T) {
	chdirRoot(t)
	trace := "testdata/flame-moe-290m/trace.jsonl"
	dir := t.TempDir()
	plan := filepath.Join(dir, "p.json")
	code, _, stderr := runCLI(t, "plan", "--trace", trace, "--strategy", "greedy", "--out", plan, "--quiet")
	require.Equal(t, 0, code, stderr)
	const note = "moetuner: note: per-token paths sampled: "
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"stats", []string{"stats", trace, trace}},
		{"eval", []string{"eval", "--trace", trace, "--trace", trace, "--plan", plan}},
		{"plan", []string{"plan", "--trace", trace, "--strategy", "greedy", "--out", filepath.Join(dir, "q.json")}},
		{"compare", []string{"compare", "--trace", trace, "--strategies", "contiguous,greedy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := filepath.Join(dir, tc.name+".out.json")
			args := append(append([]string{}, tc.args...), "--path-error", "0.5", "--json", js)
			code, stdout, stderr := runCLI(t, args...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, 1, strings.Count(stderr, note), stderr)
			assert.Equal(t, 1, strings.Count(stderr, "moetuner: note:"), stderr)
			assert.NotContains(t, stdout, "note")
			data, err := os.ReadFile(js)
			require.NoError(t, err)
			assert.NotContains(t, string(data), "paths sampled")

			code, _, stderr = runCLI(t, append(args, "--quiet")...)
			require.Equal(t, 0, code, stderr)
			assert.NotContains(t, stderr, "note")

			code, _, stderr = runCLI(t, append(append([]string{}, tc.args...), "--path-error", "0")...)
			require.Equal(t, 0, code, stderr)
			assert.NotContains(t, stderr, "note", "every path kept")
		})
	}

	out := filepath.Join(dir, "s.json")
	code, _, stderr = runCLI(t, "stats", trace, "--path-error", "0.5", "--out", out)
	require.Equal(t, 0, code, stderr)
	src, err := routing.Load(out, routing.LoadOptions{})
	require.NoError(t, err)
	want, _ := routing.PathSampleSize(1024, 8, 6, 0.5)
	assert.Equal(t, routing.PathSample{Tokens: 1024, Kept: want, RelStdErr: src.Stats.PathSample.RelStdErr}, src.Stats.PathSample)
	require.Len(t, src.Stats.Notes, 1)
	assert.Contains(t, src.Stats.Notes[0], "per-token paths sampled: 25 of 1024 tokens kept")

	code, _, stderr = runCLI(t, "stats", trace, "--path-error", "-1")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--path-error -1: want 0 (every path) or a positive relative error")
}

// TestRedundantSlotsNote: every expert a GPU holds costs a weight read a
// layer, so at small loads redundant slots can cost more than the balance
// they buy. On the Mixtral popularity counts (1 × 4 GPUs, 4 redundant
// slots) every strategy fills the 12 slots a layer (greedy too: it once
// left them out), and the running greedy plan without copies (--plan, 8
// slots a layer) is modeled faster than joint with 12: compare says so
// with the flag to change; with no redundant slots joint is fastest and
// nothing is said; with weight reads priced at nothing (a cluster file's
// expert_cost) the redundant slots pay and nothing is said either.
func TestRedundantSlotsNote(t *testing.T) {
	chdirRoot(t)
	trace := "testdata/mixtral-8x7b/fiddler/expert_popularity_machine_learning.json"
	base := []string{"compare", "--trace", trace, "--nodes", "1", "--gpus-per-node", "4", "--strategies", "greedy,eplb,joint", "--effort", "1", "--quiet"}
	running := filepath.Join(t.TempDir(), "greedy8.json")
	code, _, stderr := runCLI(t, "plan", "--trace", trace, "--nodes", "1", "--gpus-per-node", "4", "--strategy", "greedy", "--quiet", "--out", running)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := runCLI(t, append(base, "--redundant-slots", "4", "--plan", running)...)
	require.Equal(t, 0, code, stderr)
	file, joint := layerTimeOf(t, stdout, "file:"+running), layerTimeOf(t, stdout, "joint")
	require.Less(t, file, joint, stdout)
	assert.Contains(t, stdout, "file:"+running+" (8 slots a layer) is modeled", stdout)
	assert.Contains(t, stdout, "faster than joint (12)", stdout)
	assert.Contains(t, stdout, "fewer --redundant-slots", stdout)
	assert.NotContains(t, stdout, "greedy (8 slots a layer)", stdout)

	code, stdout, stderr = runCLI(t, append(base, "--redundant-slots", "0")...)
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, stdout, "slots a layer", stdout)

	cluster := filepath.Join(t.TempDir(), "free-weights.yaml")
	require.NoError(t, os.WriteFile(cluster, []byte("nodes: 1\ngpus_per_node: 4\nnvlink_gbps: 900\nnic_gbps: 400\ntflops: 989\nhbm_gbps: 3350\nexpert_cost: 1ns\n"), 0o644))
	code, stdout, stderr = runCLI(t, "compare", "--trace", trace, "--cluster", cluster, "--strategies", "greedy,joint", "--effort", "1", "--quiet", "--redundant-slots", "4")
	require.Equal(t, 0, code, stderr)
	require.Less(t, layerTimeOf(t, stdout, "joint"), layerTimeOf(t, stdout, "greedy"), stdout)
	assert.NotContains(t, stdout, "slots a layer", stdout)
}

// layerTimeOf reads strategy's layer time, in seconds, from compare's
// table.
func layerTimeOf(t *testing.T, table, strategy string) float64 {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || strings.TrimSuffix(f[0], "*") != strategy {
			continue
		}
		d, err := time.ParseDuration(strings.ReplaceAll(f[6], "µ", "u"))
		require.NoError(t, err, line)
		return d.Seconds()
	}
	t.Fatalf("no %s row in\n%s", strategy, table)
	return 0
}
