package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const casesDir = "testdata/serving-stacks/cases"

// TestPPLayerOffsetFlag: --pp-layer-offset joins a pipeline-parallel
// Megatron trace's stages into the model's 8 layers (without it the two
// stages' stage-local layers 0-3 read as 4 layers), and a malformed value
// is a usage error naming the flag.
func TestPPLayerOffsetFlag(t *testing.T) {
	chdirRoot(t)
	code, stdout, stderr := runCLI(t, "stats", casesDir+"/megatron_pp", "--pp-layer-offset", "0=0,1=0,2=4,3=4")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "tokens 128  layers 8  experts 64  top-k 6")
	assert.Contains(t, stderr, "note: Megatron router traces: 2 pipeline stages (layer ids 0-3, 4-7) joined into 2 pipelines")
	code, stdout, stderr = runCLI(t, "stats", casesDir+"/megatron_pp")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "tokens 256  layers 4")

	code, _, stderr = runCLI(t, "stats", casesDir+"/megatron_pp", "--pp-layer-offset", "0=x")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `--pp-layer-offset "0=x": "0=x" is not RANK=OFFSET or OFFSET`)
	code, _, stderr = runCLI(t, "plan", "--trace", casesDir+"/megatron_pp", "--pp-layer-offset", "0=0,1=0,2=4", "--out", t.TempDir()+"/p.json")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "rank 3 has no layer offset: give every rank file its stage's offset (--pp-layer-offset RANK=OFFSET,...)")
}

// TestBacktestRefusesUnorderedSteps: a full SGLang stat buffer's passes
// have no known time order; backtest says so instead of replaying them in
// buffer order.
func TestBacktestRefusesUnorderedSteps(t *testing.T) {
	chdirRoot(t)
	code, _, stderr := runCLI(t, "backtest", "--trace", casesDir+"/sglang_stat_full.pt", "--top-k", "6")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "sglang_stat_full.pt: the time order of its steps is unknown (an SGLang stat dump whose circular buffer is full)")
}
