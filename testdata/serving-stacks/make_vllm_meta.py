# Writes vllm_eplb_load_meta.jsonl: vLLM #41141's newer stats JSONL, one
# "eplb_load_meta" record first, then one "eplb_load_stats" record per
# step ("expert_load" [layers][physical slots], "p2l_map" [layers][slots]),
# as vllm/distributed/eplb/stats_loader.py parse_stats_jsonl reads them.
# Pure Python; run from this folder:  python3 make_vllm_meta.py
#
# Real: every token's top-6 experts, the first 128 tokens of
# ../flame-moe-290m/trace.jsonl. Made up: the deployment the meta record
# describes (8 ranks on 2 nodes, 1 expert group, 8 redundant experts:
# P = 72 slots for 64 experts, MoE layers 0-7), the placement and which
# copy a token used; steps of 32 tokens.
import json, random

random.seed(41141)
T, L, E, R, G, K = 128, 8, 64, 8, 8, 6
P = E + R
lines = open("../flame-moe-290m/trace.jsonl").read().splitlines()[1:1 + T]
tokens = [json.loads(l)["layers"] for l in lines]

p2l = []
for l in range(L):
    perm = list(range(E))
    random.shuffle(perm)
    p2l.append(perm + random.sample(range(E), R))
copies = [{} for _ in range(L)]
for l in range(L):
    for s, e in enumerate(p2l[l]):
        copies[l].setdefault(e, []).append(s)

with open("vllm_eplb_load_meta.jsonl", "w") as f:
    f.write(json.dumps({"record_type": "eplb_load_meta", "version": 1, "model": "flame-moe-290m", "num_ranks": G,
                        "num_groups": 1, "num_nodes": 2, "num_layers": L, "num_redundant_experts": R}) + "\n")
    for step in range(4):
        load = [[0] * P for _ in range(L)]
        for t in range(step * 32, step * 32 + 32):
            for l in range(L):
                for e in tokens[t][l]:
                    load[l][random.choice(copies[l][e])] += 1
        f.write(json.dumps({"record_type": "eplb_load_stats", "version": 1, "step": 1000 * (step + 1),
                            "expert_load": load, "p2l_map": p2l}) + "\n")
