package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
)

func TestReplaySim(t *testing.T) {
	chdirRoot(t)
	js := filepath.Join(t.TempDir(), "replay.json")
	code, stdout, stderr := runCLI(t, "replay", "--trace", "testdata/flame-moe-290m/trace.jsonl",
		"--plan", "testdata/plans/flame-contiguous.json", "--plan", "testdata/plans/flame-joint.json", "--json", js)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "backend sim")
	assert.Contains(t, stdout, "B vs A tail")
	assert.Contains(t, stdout, "compute: modeled")
	assert.Contains(t, stdout, "communication: modeled")
	assert.Contains(t, stdout, "total")
	assert.Regexp(t, `total .* [-+]\d+\.\d%`, stdout)
	assert.Regexp(t, `B vs A \(sim is deterministic, no interval needed\): tail -\d+\.\d%, mean [-+]\d+\.\d%, layer -\d+\.\d%`, stdout)
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	var out jsonReplay
	require.NoError(t, json.Unmarshal(data, &out))
	require.Len(t, out.Plans, 2)
	assert.Equal(t, "sim", out.Backend)
	assert.Len(t, out.Plans[1].Measurement.Layers, 8)
	assert.Less(t, out.Plans[1].Measurement.Tail, out.Plans[0].Measurement.Tail)
	require.NotNil(t, out.Comparison)
	assert.Equal(t, 1, out.Comparison.Rounds, "sim is deterministic: one round")
	require.Len(t, out.Comparison.Diffs, 1)
	assert.Negative(t, out.Comparison.Diffs[0].Tail.Estimate)

	code, stdout, stderr = runCLI(t, "replay", "--trace", "testdata/flame-moe-290m/trace.jsonl",
		"--plan", "testdata/plans/flame-joint.json", "--mode", "overlapped", "--batch-tokens", "256")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "4 iteration(s) of 256 tokens")
	assert.NotContains(t, stdout, "vs A")
}

func TestReplayCPUCalibrate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs GEMMs")
	}
	chdirRoot(t)
	dir := t.TempDir()
	cl := filepath.Join(dir, "cluster.yaml")
	code, stdout, stderr := runCLI(t, "replay", "--trace", "testdata/mixtral-8x7b/fiddler",
		"--plan", "testdata/plans/mixtral-contiguous.json", "--plan", "testdata/plans/mixtral-joint.json",
		"--backend", "cpu", "--hidden", "64", "--ffn", "224", "--batch-tokens", "512", "--iterations", "1", "--repeats", "1",
		"--calibrate", cl)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "compute: measured")
	assert.Contains(t, stdout, "B vs A tail")
	assert.Contains(t, stdout, "calibrated on 256 GPU-layer shares at hidden 64, FFN 224")
	assert.Contains(t, stdout, "token scale 0.0625") // the default
	assert.Contains(t, stdout, "differences with 95% confidence intervals (percentile bootstrap over ")
	assert.Regexp(t, `B vs A: tail [-+]\d+\.\d% \[[-+]\d+\.\d, [-+]\d+\.\d\]( within noise)?, mean [-+]\d+\.\d% \[`, stdout)
	assert.Regexp(t, `(?m)^moetuner: replay cpu: 2 plans, \d+ rounds, stopped after \d+\.\ds: `, stderr)
	assert.Contains(t, stdout, "cost model vs measurement")
	c, err := costmodel.LoadCluster(cl)
	require.NoError(t, err)
	assert.Positive(t, c.TokenCost)
	assert.Equal(t, 4, c.GPUsPerNode)
}

func TestReplayErrors(t *testing.T) {
	chdirRoot(t)
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no plan":         {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl"}, 2, "needs --plan"},
		"no trace":        {[]string{"--plan", "testdata/plans/flame-joint.json"}, 2, "no --trace"},
		"bad backend":     {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json", "--backend", "tpu"}, 2, "want one of sim, cpu, gpu"},
		"plan mismatch":   {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/mixtral-joint.json"}, 1, "testdata/plans/mixtral-joint.json records 4 GPUs (gpus) but the cluster has 8 (1 nodes × 8 GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size"},
		"sim calibrate":   {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json", "--calibrate", "x.yaml"}, 2, "cpu or gpu"},
		"bad flag":        {[]string{"--nope"}, 2, "flag provided but not defined"},
		"bad confidence":  {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json", "--confidence", "95"}, 2, "--confidence 95: want a level between 0 and 1"},
		"negative rounds": {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json", "--rounds", "-1"}, 2, "must not be negative"},
		"missing plan":    {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "nope.json"}, 1, "nope.json"},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCLI(t, append([]string{"replay"}, tc.args...)...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.want)
		})
	}
	code, _, stderr := runCLI(t, "replay", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "-backend")
	assert.Contains(t, stderr, "-calibrate")
}

// TestReplayInterrupted: a signal after some rounds stops replay, which
// reports what the complete rounds measured and exits 0.
func TestReplayInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs GEMMs")
	}
	chdirRoot(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	timer := time.AfterFunc(1500*time.Millisecond, func() { cancel(&interruptError{sig: syscall.SIGTERM}) })
	defer timer.Stop()
	var out, errb strings.Builder
	code := run(ctx, []string{"replay", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-contiguous.json", "--plan", "testdata/plans/flame-joint.json",
		"--backend", "cpu", "--hidden", "16", "--ffn", "56", "--repeats", "1", "--min-rounds", "100000", "--rounds", "100000"}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, 0, code, errb.String())
	assert.Regexp(t, `percentile bootstrap over \d+ interleaved rounds, .*interrupted after`, out.String())
	assert.Contains(t, out.String(), "B vs A: tail ")
}
