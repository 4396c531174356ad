# Writes the fixtures of this folder, in the exact structures the stacks
# write, from the first 128 tokens of ../../flame-moe-290m/trace.jsonl
# (FLAME-MoE-290M, Apache-2.0: 8 MoE layers, 64 experts, top-6). Needs
# PyTorch (Debian's python3-torch); run from this folder:
#   /usr/bin/python3 gen.py
# expected.json says what each fixture must read as.
#
# SGLang stat dumps: _StatAccumulator.dump of a _CircularBuffer
# (python/sglang/srt/eplb/expert_distribution.py@02295fe): the whole buffer
# in buffer order, no write index; reset zeroes the rows but keeps the
# index. The class below is that buffer, driven the way the recorder
# drives it.
#
# Megatron router traces (megatron/core/transformer/moe/router_trace.py,
# c1560d9): records {"step","stage","block","layer","rank","num_tokens",
# "topk","top_indices"}; in training "layer" is N of decoder.layers.N of
# the stage's chunk; record_indices stamps the ids it is given (inference:
# layer_number, 1-based); --moe-routing-trace-dump-weights adds
# router_state_rank{r}.pt (torch.save of {layer: {"weight", "expert_bias",
# "score_function", "topk"}}), hidden_states_rank{r}.bin and
# logits_rank{r}.bin (bf16 bytes, with hs_*/logit_* fields in the records).
import json, os, struct

import torch

torch.manual_seed(0)

T, E, K, L = 128, 64, 6, 8
lines = open("../../flame-moe-290m/trace.jsonl").read().splitlines()[1:1 + T]
tokens = [json.loads(l)["layers"] for l in lines]  # [T][8][6], logical
PASS = 16
passes = [list(range(s, s + PASS)) for s in range(0, T, PASS)]  # 8 passes


def logical_count(ts, l_all=L):
    c = torch.zeros((l_all, E), dtype=torch.int32)
    for t in ts:
        for l in range(L):
            for e in tokens[t][l]:
                c[l, e] += 1
    return c


class CircularBuffer:  # SGLang's _CircularBuffer
    def __init__(self, size):
        self._buffer = torch.zeros((size, L, E), dtype=torch.int32)
        self._curr_index = 0

    def append(self, value):
        self._buffer[self._curr_index] = value
        self._curr_index = (self._curr_index + 1) % len(self._buffer)

    def get_all(self):
        return self._buffer

    def reset(self):
        self._buffer[...] = 0


def stat_dump(buf, name):
    torch.save({"rank": 0, "logical_count": buf.get_all().clone(),
                "average_utilization_rate_over_window": None}, name)


expected = {}
# A recording of passes 0-2, dumped (reset keeps the index at 3), then a
# recording of passes 3-7 in a buffer of 6: rows 3,4,5,0,1 hold passes
# 3..7, row 2 is unfilled. Buffer order would give 6,7,_,3,4,5.
buf = CircularBuffer(6)
for i in range(3):
    buf.append(logical_count(passes[i]))
buf.reset()
for i in range(3, 8):
    buf.append(logical_count(passes[i]))
stat_dump(buf, "sglang_stat_wrapped.pt")
expected["sglang_stat_wrapped.pt"] = {
    "passes_in_time_order": [3, 4, 5, 6, 7],
    "step_load_layer0": [logical_count(passes[i])[0].tolist() for i in range(3, 8)],
}
# 8 passes in a buffer of 4: full, wrapped; the oldest row is not known.
buf = CircularBuffer(4)
for i in range(8):
    buf.append(logical_count(passes[i]))
stat_dump(buf, "sglang_stat_full.pt")
expected["sglang_stat_full.pt"] = {"passes_in_buffer_order": [4, 5, 6, 7], "order_known": False}


def record(step, layer, rank, ts, **extra):
    rows = [tokens[t][layer_of[layer]] for t in ts]
    r = {"step": step, "stage": "pre_dispatch", "block": "decoder", "layer": layer, "rank": rank,
         "num_tokens": len(ts), "topk": K}
    r.update(extra)
    r["top_indices"] = rows
    return r


def write(dirname, rank, recs):
    os.makedirs(dirname, exist_ok=True)
    with open(f"{dirname}/router_trace_rank{rank}.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


# Pipeline parallel, training: 2 stages × 2 data-parallel ranks (ranks 0,1
# stage 0 with decoder layers 0-3, ranks 2,3 stage 1 with 4-7), one
# micro-batch of 32 tokens per step, 2 steps. Stage-local ids 0-3 in both.
layer_of = {l: l for l in range(4)}
for rank in range(4):
    stage, dp = rank // 2, rank % 2
    recs = []
    for step in range(2):
        ts = list(range((step * 2 + dp) * 32, (step * 2 + dp + 1) * 32))
        for local in range(4):
            layer_of[local] = stage * 4 + local
            recs.append(record(step, local, rank, ts))
    write("megatron_pp", rank, recs)
expected["megatron_pp"] = {"pp_layer_offset": "0=0,1=0,2=4,3=4", "layers": list(range(8)), "tokens": 128,
                           "source_of_token_block": {"0": 0, "1": 1, "2": 0, "3": 1}}

# Virtual pipeline (2 chunks of 2 layers on one rank, PP 2): both chunks'
# routers are decoder.layers.0/1 of their chunk, so one step's records
# repeat layers 0 and 1 (chunk 0 holds decoder layers 0-1, chunk 1 4-5).
recs = []
ts = list(range(32))
for chunk_first in (0, 4):
    for local in range(2):
        layer_of[local] = chunk_first + local
        recs.append(record(0, local, 0, ts))
write("megatron_vpp", 0, recs)
expected["megatron_vpp"] = {"error": "step 0 layer 0 recorded twice"}

# Inference through record_indices: layer ids are layer_number, 1..8 for
# the 8 decoder layers (all MoE), one step of 64 tokens per rank.
for rank in range(2):
    ts = list(range(rank * 64, (rank + 1) * 64))
    recs = []
    for l in range(L):
        layer_of[l + 1] = l
        recs.append(record(0, l + 1, rank, ts))
    write("megatron_inference", rank, recs)
expected["megatron_inference"] = {"num_hidden_layers": 8, "layers": list(range(8)), "tokens": 128}

# Inference with pipeline parallelism through record_indices: global
# 1-based ids, stage 0 (rank 0) layers 1-4, stage 1 (rank 1) layers 5-8,
# the same 64 tokens.
ts = list(range(64))
for rank in range(2):
    recs = []
    for l in range(rank * 4, rank * 4 + 4):
        layer_of[l + 1] = l
        recs.append(record(0, l + 1, rank, ts))
    write("megatron_pp_inference", rank, recs)
expected["megatron_pp_inference"] = {"num_hidden_layers": 8, "layers": list(range(8)), "tokens": 64}

# Training with --moe-routing-trace-dump-weights and hidden-state/logit
# capture: one rank, the whole model, the sidecars beside the trace.
layer_of = {l: l for l in range(L)}
os.makedirs("megatron_sidecars", exist_ok=True)
recs, hs, lg = [], b"", b""
ts = list(range(32))
for l in range(L):
    h = torch.randn(len(ts), 16).to(torch.bfloat16)
    g = torch.randn(len(ts), E).to(torch.bfloat16)
    hb, gb = h.view(torch.int16).numpy().tobytes(), g.view(torch.int16).numpy().tobytes()
    recs.append(record(0, l, 0, ts, hs_offset=len(hs), hs_bytes=len(hb), hs_shape=list(h.shape),
                       logit_offset=len(lg), logit_bytes=len(gb), logit_shape=list(g.shape)))
    hs += hb
    lg += gb
write("megatron_sidecars", 0, recs)
open("megatron_sidecars/hidden_states_rank0.bin", "wb").write(hs)
open("megatron_sidecars/logits_rank0.bin", "wb").write(lg)
state = {l: {"weight": torch.randn(E, 16), "expert_bias": None, "score_function": "softmax", "topk": K}
         for l in range(L)}
torch.save(state, "megatron_sidecars/router_state_rank0.pt")
expected["megatron_sidecars"] = {"layers": list(range(8)), "tokens": 32,
                                 "skipped": ["hidden_states_rank0.bin", "logits_rank0.bin", "router_state_rank0.pt"]}

with open("expected.json", "w") as f:
    json.dump(expected, f, indent=1)
    f.write("\n")
