package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// Every command given --time-limit ends within it plus 10 %, reading the
// traces included, on every solve path: one node (the ILP and its
// polish), several nodes with the chain flow (at toy and production
// scale), replicas under static
// dispatch (the affinity search), the paper's method, and, where the
// shared traces are present, DeepSeek-V3's counts and a 32k-token
// per-token trace whose reading takes a good part of the limit. Each limit
// is at least three times the command's floor (its run with a 1 ms limit:
// reading, one evaluation, a first plan), which a loaded machine raises. A command
// that counted its limit per strategy, or from after reading, or that
// evaluated its plan again after the limit, ends past it. The plan it
// writes is valid.
func TestTimeLimitHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs each path for its full limit")
	}
	chdirRoot(t)
	mixtral := "testdata/mixtral-8x7b/fiddler"
	flame := "testdata/flame-moe-290m/trace.jsonl"
	shared := filepath.Join("..", "shared", "traces")
	counts := filepath.Join(shared, "sglang-deepseek-v3-expert-counts", "prefill_in4096.json")
	npy := filepath.Join(shared, "synthetic-deepseek-v3", "ds3-prefill4096-32k.npy")
	cases := []struct {
		name  string
		limit time.Duration
		args  []string
		needs string
	}{
		{"plan/mixtral", 2 * time.Second, []string{"plan", "--trace", mixtral}, ""},
		{"plan/flame-one-node", 3 * time.Second, []string{"plan", "--trace", flame}, ""},
		{"plan/flame-chain", 3 * time.Second, []string{"plan", "--trace", flame, "--nodes", "2", "--flow", "chain"}, ""},
		{"plan/flame-replicas-static", 3 * time.Second, []string{"plan", "--trace", flame, "--nodes", "2", "--redundant-slots", "16", "--dispatch", "static"}, ""},
		{"compare/flame-paper-and-joint", 3 * time.Second, []string{"compare", "--trace", flame, "--strategies", "eplb,moetuner,joint"}, ""},
		{"compare/flame-chain", 3 * time.Second, []string{"compare", "--trace", flame, "--nodes", "2", "--flow", "chain"}, ""},
		{"plan/deepseek-counts", 2 * time.Second, []string{"plan", "--trace", counts, "--nodes", "4", "--redundant-slots", "32"}, counts},
		{"compare/deepseek-counts", 3 * time.Second, []string{"compare", "--trace", counts, "--nodes", "4", "--redundant-slots", "32"}, counts},
		{"plan/deepseek-32k", 8 * time.Second, []string{"plan", "--trace", npy, "--model", "deepseek-v3", "--nodes", "4", "--redundant-slots", "32", "--dispatch", "static"}, npy},
		{"plan/deepseek-32k-chain", 8 * time.Second, []string{"plan", "--trace", npy, "--model", "deepseek-v3", "--nodes", "4", "--flow", "chain"}, npy},
		{"plan/deepseek-32k-chain-replicas-split", 8 * time.Second, []string{"plan", "--trace", npy, "--model", "deepseek-v3", "--nodes", "4", "--flow", "chain", "--redundant-slots", "32", "--split", "optimal"}, npy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.needs != "" {
				if _, err := os.Stat(c.needs); err != nil {
					t.Skip("../shared/traces is absent")
				}
			}
			out := ""
			with := func(limit time.Duration) []string {
				args := append(slices.Clone(c.args), "--time-limit", limit.String(), "--quiet")
				if args[0] == "plan" {
					out = filepath.Join(t.TempDir(), "plan.json")
					args = append(args, "--out", out)
				}
				return args
			}
			// The floor: reading, one evaluation and a first plan, what
			// no limit can cut (it grows with the machine's load). The
			// limit under test is at least three times it.
			start := time.Now()
			code, _, stderr := runCLI(t, with(time.Millisecond)...)
			floor := time.Since(start)
			require.Equal(t, 0, code, stderr)
			limit := max(c.limit, 3*floor)
			args := with(limit)
			start = time.Now()
			code, stdout, stderr := runCLI(t, args...)
			took := time.Since(start)
			require.Equal(t, 0, code, stderr)
			t.Logf("%s: %v for a %v limit (floor %v)", strings.Join(args, " "), took.Round(time.Millisecond), limit, floor.Round(time.Millisecond))
			assert.LessOrEqual(t, took, limit+limit/10, "%s\n%s", stdout, stderr)
			if out != "" {
				p, err := placement.ReadFile(out)
				require.NoError(t, err)
				require.NoError(t, p.Validate(placement.ValidateOptions{}))
			}
		})
	}
}
