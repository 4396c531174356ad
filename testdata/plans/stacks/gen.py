#!/usr/bin/env python3
"""Writes one FLAME-MoE-290M placement in every serving stack's own format.

The deployment is made up: decoder layers 0-1 dense, 2-9 MoE; 64 logical
experts plus 8 redundant slots (P = 72) on 8 EP ranks, 9 slots per rank.
Per MoE layer: a seeded permutation of the 64 experts, 8 per rank, plus one
more copy of each of the layer's 8 hottest experts (by the load in
../../flame-moe-290m/trace.jsonl) on a rank that does not hold it yet.
Every file below holds that same placement, written with Python's json and
plain text the way the stacks' own tools write them, not with moetuner.

    python3 testdata/plans/stacks/gen.py   (from the repository root)
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "flame-moe-290m", "trace.jsonl")
E, R, G, DECODER, MOE = 64, 8, 8, 10, list(range(2, 10))
P = E + R
PER = P // G

loads = [[0] * E for _ in MOE]
with open(TRACE) as f:
    f.readline()  # header
    for line in f:
        for l, ids in enumerate(json.loads(line)["layers"]):
            for e in ids:
                loads[l][e] += 1

rng = random.Random(20260117)
phy2log = []
for l in range(len(MOE)):
    perm = list(range(E))
    rng.shuffle(perm)
    ranks = [perm[g * 8:(g + 1) * 8] for g in range(G)]
    hot = sorted(range(E), key=lambda e: (-loads[l][e], e))[:R]
    while True:
        order = list(range(G))
        rng.shuffle(order)
        if all(h not in ranks[g] for h, g in zip(hot, order)):
            break
    for h, g in zip(hot, order):
        ranks[g].append(h)
    phy2log.append([e for g in range(G) for e in ranks[g]])

trivial = [p % E for p in range(P)]
rows = {d: phy2log[MOE.index(d)] if d in MOE else trivial for d in range(DECODER)}


def write(name, text):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(text)


# SGLang --init-expert-location: one row per decoder layer.
write("flame.sglang.json", json.dumps({"physical_to_logical_map": [rows[d] for d in range(DECODER)]}) + "\n")

# DeepSeek EPLB's three maps, as rebalance_experts returns them (no GPU count).
logcnt = [[row.count(e) for e in range(E)] for row in phy2log]
x = max(max(c) for c in logcnt)
log2phy = [[[p for p, v in enumerate(row) if v == e] + [-1] * (x - row.count(e)) for e in range(E)] for row in phy2log]
write("flame.eplb.json", json.dumps({"phy2log": phy2log, "log2phy": log2phy, "logcnt": logcnt}, indent=1) + "\n")

# TensorRT-LLM moe_load_balancer, with the ep_size its scripts add.
lines = ["num_slots: %d" % P, "ep_size: %d" % G, "initial_global_assignments:"]
lines += ["  %d: [%s]" % (d, ", ".join(map(str, phy2log[i]))) for i, d in enumerate(MOE)]
lines += ["layer_updates_per_iter: 0"]
write("flame.trtllm.yaml", "\n".join(lines) + "\n")

# vLLM eplb_config.initial_expert_map_path (#49572): one list per MoE layer.
write("flame.vllm-map.json", json.dumps(phy2log) + "\n")

# vLLM offline EPLB mapping record (#41141).
write("flame.vllm-mapping.jsonl", json.dumps({
    "record_type": "eplb_initial_mapping", "version": 1, "num_redundant_experts": R, "num_slots": P,
    "initial_global_assignments": {str(i): row for i, row in enumerate(phy2log)}}) + "\n")

# vllm-ascend / MindIE expert_map_path.
write("flame.vllm-ascend.json", json.dumps({"moe_layer_count": len(MOE), "layer_list": [
    {"layer_id": i, "device_count": G, "device_list": [
        {"device_id": g, "device_expert": row[g * PER:(g + 1) * PER]} for g in range(G)]}
    for i, row in enumerate(phy2log)]}, indent=2) + "\n")

# SGLang --init-expert-location as a .pt: the same map, written by
# torch.save (needs PyTorch: apt-get install python3-torch); skipped, with
# the file left as it is, where torch is missing.
try:
    import torch
except ImportError:
    print("no torch: flame.sglang.pt left as it is")
else:
    m = torch.tensor([rows[d] for d in range(DECODER)], dtype=torch.int64)
    path = os.path.join(HERE, "flame.sglang.pt")
    torch.save({"physical_to_logical_map": m}, path)
    print("wrote", path)
