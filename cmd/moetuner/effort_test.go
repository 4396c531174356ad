package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With --effort the same inputs give byte-identical plans whatever the
// process's parallelism and the machine's load: each path (the one-node
// ILP, polish and annealing; replicas on two nodes with the affinity
// search; the chain flow's affinity search on 2 × 8 GPUs; each on the
// first 256 tokens to keep it to seconds) runs once with GOMAXPROCS=1 and once with
// GOMAXPROCS=2 while busy loops hold every core. A search that read the
// clock (a deadline, a temperature that follows time), merged parallel
// results in completion order or split its work by the number of cores
// (as the chain's exact annealing did) gives different bytes.
func TestEffortReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and solves each path twice")
	}
	bin := buildBinary(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	flame := filepath.Join(root, "testdata", "flame-moe-290m", "trace.jsonl")
	data, err := os.ReadFile(flame)
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	require.Greater(t, len(lines), 257, "%s: header and 256 tokens", flame)
	short := filepath.Join(t.TempDir(), "flame-256.jsonl")
	require.NoError(t, os.WriteFile(short, bytes.Join(lines[:257], nil), 0o644))
	// A running plan for the budgeted cases, EPLB's with 16 redundant
	// slots.
	running := filepath.Join(t.TempDir(), "running.json")
	msg, err := exec.Command(bin, "plan", "--strategy", "eplb", "--quiet", "--out", running, "--trace", short, "--nodes", "2", "--redundant-slots", "16").CombinedOutput()
	require.NoError(t, err, "%s", msg)
	// Every case plans on the first 256 tokens: the paths are those of the
	// whole trace at a quarter of the work per move, which keeps the ten
	// solves within the package's time on a loaded machine.
	cases := map[string][]string{
		"one-node": {"--trace", short},
		// From a running plan under a move budget.
		"budget-home": {"--trace", short, "--nodes", "2", "--dispatch", "static", "--from", running, "--max-moves", "8"},
		// The chain flow's vetoes and its priced polish (4.5 s a run on
		// an idle 2-core machine).
		"budget-chain":      {"--trace", short, "--nodes", "2", "--flow", "chain", "--from", running, "--max-moves", "8"},
		"replicas-affinity": {"--trace", short, "--nodes", "2", "--redundant-slots", "16", "--dispatch", "static"},
		// 64 experts on 16 GPUs is past the joint ILP's size: the chain
		// search with its exact annealing in blocks of layers.
		"chain-affinity": {"--trace", short, "--nodes", "2", "--gpus-per-node", "8", "--flow", "chain"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			var plans [][]byte
			for i, procs := range []string{"1", "2"} {
				ctx, stop := context.WithCancel(context.Background())
				if i == 1 {
					for range runtime.NumCPU() {
						go func() {
							for ctx.Err() == nil {
							}
						}()
					}
				}
				out := filepath.Join(t.TempDir(), "plan.json")
				cmd := exec.Command(bin, append([]string{"plan", "--effort", "1", "--quiet", "--out", out}, args...)...)
				cmd.Env = append(os.Environ(), "GOMAXPROCS="+procs)
				msg, err := cmd.CombinedOutput()
				stop()
				require.NoError(t, err, "%s", msg)
				data, err := os.ReadFile(out)
				require.NoError(t, err)
				plans = append(plans, data)
			}
			assert.True(t, bytes.Equal(plans[0], plans[1]), "GOMAXPROCS=1 and GOMAXPROCS=2 under load wrote different plans")
		})
	}
}
