package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// smallTrace writes a DeepSeek-V3-shaped trace (256 experts, top-8) of a
// few hundred tokens on 16 source GPUs and three layers, small enough for
// every experiment to finish in a fraction of a second on 2 nodes.
func smallTrace(t *testing.T) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	tr := testkit.RandomTrace(rng, 300, 3, 256, 8)
	tr.Source = make([]int32, tr.Tokens)
	for i := range tr.Source {
		tr.Source[i] = int32(rng.IntN(16))
	}
	path := filepath.Join(t.TempDir(), "small.jsonl")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, routing.WriteJSONL(f, tr))
	require.NoError(t, f.Close())
	return path
}

func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// Every experiment runs on a small trace and prints its findings, one
// line per layer asked for where it works per layer. A subcommand that
// did nothing, dropped a layer or lost its flags fails.
func TestExperimentsRun(t *testing.T) {
	trace := smallTrace(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"home", "-limit", "300ms", "-cap", "1.2"}, []string{"eplb: remote", "layer 0 plan 1:", "affinity: remote", "plan 1: busiest NIC port"}},
		{[]string{"chain", "-limit", "300ms", "-shares", "0.5,0.3"}, []string{"shares: proxy 0.5, exact 0.3", "start: compute", "plan: compute", "cross-node"}},
		{[]string{"chain-ceiling", "-limit", "200ms", "-capx", "1.1"}, []string{"swaps; cross-node"}},
		{[]string{"node-ceiling", "-layers", "0,2", "-limit", "20ms"}, []string{"layer 0 cap 1.01:", "layer 2 cap +Inf:"}},
		{[]string{"relax-node", "-layers", "1", "-limit", "20ms", "-iters", "5"}, []string{"layer 1: EPLB", "relaxed"}},
		{[]string{"hub-copies", "-layers", "0", "-limit", "20ms"}, []string{"layer 0: EPLB nodes, static split", "layer 0 cap 1.40: annealed"}},
		{[]string{"bound-budgets", "-layers", "0,1"}, []string{"layer 0: bound", "layer 1: bound", "balance-aware W*"}},
		{[]string{"balanced-bound", "-layers", "2", "-slots", "17", "-dispatch", "even"}, []string{"layer 2: bound", "at node cap 1.02"}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			args := append(slices.Clone(tc.args), "-trace", trace, "-nodes", "2")
			code, out, errs := runArgs(t, args...)
			require.Equal(t, 0, code, "stderr: %s", errs)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
		})
	}
}

// The bound is a lower bound: on every layer it is at most the remote
// count of EPLB's plan and of the node search's, as the experiment prints
// them. A port that mixed up the per-token units or the plans fails.
func TestBoundBudgetsBelowPlans(t *testing.T) {
	code, out, errs := runArgs(t, "bound-budgets", "-trace", smallTrace(t), "-nodes", "2", "-layers", "0,1,2")
	require.Equal(t, 0, code, errs)
	num := func(re string) []float64 {
		var v []float64
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(out, -1) {
			x, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			v = append(v, x)
		}
		return v
	}
	bounds := num(`: bound ([0-9.]+),`)
	eplb := num(`EPLB: +remote ([0-9.]+),`)
	search := num(`search: +remote ([0-9.]+),`)
	require.Len(t, bounds, 3)
	require.Len(t, eplb, 3)
	require.Len(t, search, 3)
	for l := range bounds {
		assert.Positive(t, bounds[l], "layer %d", l)
		assert.LessOrEqual(t, bounds[l], eplb[l]+1e-4, "layer %d", l)
		assert.LessOrEqual(t, bounds[l], search[l]+1e-4, "layer %d", l)
		assert.LessOrEqual(t, search[l], eplb[l]+1e-4, "layer %d: the search only improves", l)
	}
}

// Bad usage exits 2 and says what to fix; a failure exits 1.
func TestUsage(t *testing.T) {
	trace := smallTrace(t)
	unsourced := filepath.Join(t.TempDir(), "unsourced.npy")
	f, err := os.Create(unsourced)
	require.NoError(t, err)
	require.NoError(t, routing.WriteNPY(f, testkit.RandomTrace(rand.New(rand.NewPCG(5, 6)), 50, 2, 256, 8)))
	require.NoError(t, f.Close())
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no experiment", nil, 2, "usage:"},
		{"unknown", []string{"nope"}, 2, `unknown experiment "nope"`},
		{"help", []string{"help"}, 0, "hub-copies"},
		{"flag help", []string{"chain", "-h"}, 0, "-shares"},
		{"bad flag", []string{"chain", "-nope"}, 2, "flag provided but not defined: -nope"},
		{"bad shares", []string{"chain", "-trace", trace, "-shares", "0.8,0.3"}, 2, "-shares"},
		{"layer out of range", []string{"node-ceiling", "-trace", trace, "-layers", "0,3"}, 2, "layer 3 out of range [0,3)"},
		{"bad layers", []string{"node-ceiling", "-layers", "0,x"}, 2, "comma-separated list"},
		{"stray argument", []string{"home", "extra"}, 2, `unexpected argument "extra"`},
		{"no nodes", []string{"home", "-nodes", "0"}, 2, "-nodes 0"},
		{"bad dispatch", []string{"balanced-bound", "-dispatch", "fast"}, 2, "-dispatch"},
		{"missing trace", []string{"home", "-trace", filepath.Join(t.TempDir(), "none.npy")}, 1, "none.npy"},
		{"no sources", []string{"bound-budgets", "-trace", unsourced, "-nodes", "2", "-layers", "0"}, 2, "source rank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runArgs(t, tc.args...)
			assert.Equal(t, tc.code, code, "stdout %s stderr %s", out, errs)
			assert.Contains(t, errs, tc.want)
			if tc.code != 0 {
				assert.Empty(t, strings.TrimSpace(out))
			}
		})
	}
}
