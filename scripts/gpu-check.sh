#!/usr/bin/env bash
# gpu-check.sh: build the moetuner binary and the replay test binary, and on a
# machine with an NVIDIA GPU replay the committed contiguous and joint plans
# with the gpu backend at Mixtral-8x7B's expert shape (hidden 4096, FFN
# 14336, bf16), with Mixtral (Fiddler counts) and FLAME-MoE (per-token
# trace) token counts, plus calibration. Results go to ${OUT:-out}/ as JSON.
# Without a GPU it says so and exits 0. Bounded to well under 5 minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
bin="$out/bin"
mkdir -p "$bin"

echo "building moetuner and the replay test binary"
go build -o "$bin/moetuner" ./cmd/moetuner
go test -c -o "$bin/replay.test" ./replay

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "gpu-check: no NVIDIA GPU here (nvidia-smi missing or failing); skipped"
	exit 0
fi
nvidia-smi -L | tee "$out/gpus.txt"

# The replay package's own tests, including the real-device path.
(cd replay && timeout 60 "../$bin/replay.test" -test.run 'GPU' -test.v) | tee "$out/replay-test.txt"

mt="$bin/moetuner"
common=(--backend gpu --hidden 4096 --ffn 14336 --repeats 5 --rounds 2)

# Mixtral counts: 2 sampled batches of 4096 tokens, EP4 (4 virtual GPUs).
timeout 120 "$mt" replay --trace testdata/mixtral-8x7b/fiddler \
	--plan testdata/plans/mixtral-contiguous.json --plan testdata/plans/mixtral-joint.json \
	"${common[@]}" --batch-tokens 4096 --iterations 2 \
	--calibrate "$out/cluster-mixtral-calibrated.yaml" --json "$out/replay-mixtral.json" | tee "$out/replay-mixtral.txt"

# FLAME-MoE per-token trace (1024 tokens, 8 layers, 64 experts, 8 virtual
# GPUs) in batches of 512, run at Mixtral's expert shape.
timeout 90 "$mt" replay --trace testdata/flame-moe-290m/trace.jsonl \
	--plan testdata/plans/flame-contiguous.json --plan testdata/plans/flame-joint.json \
	"${common[@]}" --batch-tokens 512 \
	--calibrate "$out/cluster-flame-calibrated.yaml" --json "$out/replay-flame.json" | tee "$out/replay-flame.txt"

echo "gpu-check: results in $out/"
