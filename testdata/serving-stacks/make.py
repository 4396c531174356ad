# Writes the serving-stack dump fixtures in this folder from the first 128
# tokens of ../flame-moe-290m/trace.jsonl (FLAME-MoE-290M, Apache-2.0), in
# the exact structures SGLang, TensorRT-LLM, Megatron-Core and vLLM write.
# Needs PyTorch (Debian's python3-torch); run from this folder:
#   /usr/bin/python3 make.py
# Real: every token's top-6 experts. Made up: a 10-layer model whose
# decoder layers 0-1 are dense and 2-9 are FLAME's MoE layers, 64 experts
# plus 8 redundant slots (P = 72) on 8 EP ranks, a seeded placement, passes
# of 32 tokens alternating between ranks 0 and 1, and which copy a token used.
import base64, json, os, random, struct

import torch

random.seed(11)
T, L_ALL, MOE, E, P, G, K = 128, 10, list(range(2, 10)), 64, 72, 8, 6
PASS = 32
lines = open("../flame-moe-290m/trace.jsonl").read().splitlines()[1:1 + T]
tokens = [json.loads(l)["layers"] for l in lines]  # [T][8][6], logical

# Placement: per MoE layer a shuffled permutation plus copies of the 8
# hottest experts on ranks that do not hold them yet; dense layers trivial.
p2l = []
for l in range(L_ALL):
    if l not in MOE:
        p2l.append([p % E for p in range(P)])
        continue
    load = [0] * E
    for t in tokens:
        for e in t[l - 2]:
            load[e] += 1
    hot = sorted(range(E), key=lambda e: (-load[e], e))[:8]
    while True:  # retry until every hot copy lands on a rank without it
        perm = list(range(E))
        random.shuffle(perm)
        slots = [perm[g * 8:(g + 1) * 8] for g in range(G)]
        for e in hot:
            for g in random.sample(range(G), G):
                if len(slots[g]) < P // G and e not in slots[g]:
                    slots[g].append(e)
                    break
        if all(len(s) == P // G for s in slots):
            break
    p2l.append([e for g in range(G) for e in slots[g]])
assert all(len(row) == P for row in p2l)
l2p = [{} for _ in range(L_ALL)]
for l in range(L_ALL):
    for p, e in enumerate(p2l[l]):
        l2p[l].setdefault(e, []).append(p)

passes = [list(range(s, s + PASS)) for s in range(0, T, PASS)]
rank_of_pass = [i % 2 for i in range(len(passes))]


def physical(l, t):
    return [random.choice(l2p[l][e]) for e in tokens[t][l - 2]]


def logical_count(ts):
    c = torch.zeros((L_ALL, E), dtype=torch.int32)
    for t in ts:
        for l in MOE:
            for e in tokens[t][l - 2]:
                c[l, e] += 1
    return c


# torch.save records a tensor's device; SGLang's dumps say cuda:0.
cpu_tag = torch.serialization.location_tag
torch.serialization.location_tag = lambda s: "cuda:0"
buf = torch.zeros((16, L_ALL, E), dtype=torch.int32)
for i, ps in enumerate(passes):
    buf[i] = logical_count(ps)
torch.save({"rank": 0, "logical_count": buf, "average_utilization_rate_over_window": None}, "sglang_stat.pt")
torch.serialization.location_tag = cpu_tag

p2l_t = torch.tensor(p2l, dtype=torch.int64)
for r in range(2):
    per_pass, per_token = [], []
    for i, ps in enumerate(passes):
        if rank_of_pass[i] != r:
            continue
        ids = torch.full((L_ALL, len(ps), 8), -1, dtype=torch.int32)
        count = torch.zeros((L_ALL, P), dtype=torch.int32)
        for j, t in enumerate(ps):
            for l in MOE:
                ph = physical(l, t)
                ids[l, j, :K] = torch.tensor(ph, dtype=torch.int32)
                for p in ph:
                    count[l, p] += 1
        per_pass.append({"forward_pass_id": i, "rank": r, "gatherer_key": "primary", "global_physical_count": count})
        per_token.append({
            "forward_pass_id": i, "rank": r, "gatherer_key": "primary",
            "input_ids": [random.randrange(50000) for _ in ps], "positions": list(range(len(ps))),
            "extend_seq_lens": [len(ps)], "forward_mode": 1, "topk_ids_of_layer": ids,
            "misc_objects": [], "global_physical_count": count.clone(),
        })
    torch.save({"records": per_pass, "last_physical_to_logical_map": p2l_t}, f"sglang_per_pass_{r}.pt")
    torch.save({"records": per_token, "last_physical_to_logical_map": p2l_t}, f"sglang_per_token_{r}.pt")


def safetensors(path, tensors, dtype):
    fmt, size = {"I64": ("q", 8), "I32": ("i", 4)}[dtype]
    header, data = {}, b""
    for key in sorted(tensors):
        flat, shape = tensors[key]
        raw = struct.pack("<%d%s" % (len(flat), fmt), *flat)
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


# TensorRT-LLM: iterations 100-103, 16 tokens per (iteration, rank); rank 0
# writes I64 counts, rank 1 I32. A second, smaller dump (iteration 100,
# layers 2-3) adds the [E, E] co-occurrence files, which are large.
def trtllm(folder, iters, layers, with_cooc):
    os.makedirs(folder, exist_ok=True)
    json.dump({"num_experts": E, "num_experts_per_token": K}, open(f"{folder}/meta_info.json", "w"))
    for r in range(2):
        counts, cooc, sel = {}, {}, {}
        for it in range(iters):
            ts = list(range(it * 32 + r * 16, it * 32 + r * 16 + 16))
            for l in layers:
                c, m, s = [0] * E, [0] * (E * E), []
                for t in ts:
                    es = tokens[t][l - 2]
                    s += es
                    for a in es:
                        c[a] += 1
                        for b in es:
                            m[a * E + b] += 1
                key = f"{100 + it}_{l}"
                counts[key], cooc[key], sel[key] = (c, [E]), (m, [E, E]), (s, [len(ts), K])
        safetensors(f"{folder}/rank{r}.safetensors", counts, "I64" if r == 0 else "I32")
        if with_cooc:
            safetensors(f"{folder}/cooccurrence_rank{r}.safetensors", cooc, "I32")
        else:
            safetensors(f"{folder}/token_selected_experts_rank{r}.safetensors", sel, "I32")


trtllm("trtllm_expert_statistic", 4, MOE, False)
trtllm("trtllm_cooccurrence", 1, [2, 3], True)

# Megatron-Core: steps are the passes, each on its rank; one MTP record
# that the reader must skip.
os.makedirs("megatron_router_trace", exist_ok=True)
for r in range(2):
    with open(f"megatron_router_trace/router_trace_rank{r}.jsonl", "w") as f:
        for i, ps in enumerate(passes):
            if rank_of_pass[i] != r:
                continue
            for l in MOE:
                rec = {"step": i, "stage": "pre_dispatch", "block": "decoder", "layer": l, "rank": r,
                       "num_tokens": len(ps), "topk": K, "top_indices": [tokens[t][l - 2] for t in ps]}
                f.write(json.dumps(rec) + "\n")
        f.write(json.dumps({"step": 0, "stage": "pre_dispatch", "block": "mtp", "mtp_idx": 0, "layer": 10, "rank": r,
                            "num_tokens": 1, "topk": K, "top_indices": [[0, 1, 2, 3, 4, 5]]}) + "\n")

# vLLM #41141 stats: one record per pass, physical loads of the 8 MoE
# layers with their p2l_map.
with open("vllm_eplb_load_stats.jsonl", "w") as f:
    f.write(json.dumps({"record_type": "eplb_initial_mapping", "version": 1, "num_redundant_experts": P - E, "num_slots": P,
                        "initial_global_assignments": {str(i): p2l[l] for i, l in enumerate(MOE)}}) + "\n")
    for i, ps in enumerate(passes):
        load = [[0] * P for _ in MOE]
        for t in ps:
            for li, l in enumerate(MOE):
                for p in physical(l, t):
                    load[li][p] += 1
        f.write(json.dumps({"record_type": "eplb_load_stats", "version": 1, "step": i, "num_ranks": G,
                            "expert_load": load, "p2l_map": [p2l[l] for l in MOE]}) + "\n")

# SGLang return_routed_experts: two responses, int32 [positions, 10, 6],
# dense layers zero (the capture buffer is zero-initialised).
resps = []
for start, n in [(0, 40), (40, 24)]:
    flat = []
    for t in range(start, start + n):
        for l in range(L_ALL):
            flat += tokens[t][l - 2] if l in MOE else [0] * K
    resps.append({"text": "...", "meta_info": {"prompt_tokens": n - 3, "completion_tokens": 4,
                                                "routed_experts": base64.b64encode(struct.pack("<%di" % len(flat), *flat)).decode()}})
json.dump(resps, open("sglang_routed_experts.json", "w"))

expected = {
    "tokens": T, "moe_layers": MOE, "num_hidden_layers": L_ALL, "experts": E, "top_k": K, "physical_slots": P,
    "pass_tokens": PASS, "rank_of_pass": rank_of_pass,
    "logical_load_moe_layers": [[int(x) for x in logical_count(range(T))[l]] for l in MOE],
}
json.dump(expected, open("expected.json", "w"), indent=1)
