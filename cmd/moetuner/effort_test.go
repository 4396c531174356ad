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
// search; the chain flow is left out for its minutes under load) runs once with GOMAXPROCS=1 and once with
// GOMAXPROCS=2 while busy loops hold every core. A search that read the
// clock (a deadline, a temperature that follows time) or merged parallel
// results in completion order gives different bytes.
func TestEffortReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and solves each path twice")
	}
	bin := buildBinary(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	flame := filepath.Join(root, "testdata", "flame-moe-290m", "trace.jsonl")
	cases := map[string][]string{
		"one-node":          {"--trace", flame},
		"replicas-affinity": {"--trace", flame, "--nodes", "2", "--redundant-slots", "16", "--dispatch", "static"},
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
