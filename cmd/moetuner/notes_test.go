package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
