# Writes the TensorRT-LLM EXPERT_STATISTIC_PATH fixtures that make.py does
# not: the load balancer's per-slot statistics, the rank{r}_raw files and a
# dump taken without attention DP. Pure Python (json, struct, random): the
# .safetensors bytes are laid out as safetensors.torch.save_file lays them
# (8-byte little-endian header length, JSON header with "__metadata__"
# {"format": "pt"} padded with spaces to 8 bytes, tensors end to end in
# key order). Run from this folder:  python3 make_trtllm.py
#
# Real: every token's top-6 experts, the first 128 tokens of
# ../flame-moe-290m/trace.jsonl (FLAME-MoE-290M, Apache-2.0). Made up: the
# deployment (8 EP ranks, MoE layers 2-9 of 10, P = 72 slots for 64
# experts), the placement, which copy a token used (a seeded random choice,
# as a static placement sends a token to one of its expert's slots) and
# which rank routed which tokens.
#
# Upstream structures reproduced (tensorrt_llm/_torch/expert_statistic.py):
# - NVIDIA/TensorRT-LLM@7ce477f: rank{r}.safetensors holds the bincount
#   (int64 [num_experts]) and rank{r}_raw.safetensors the raw
#   token_selected_experts (int32 [T, k]) per "{iter}_{layer}", for the
#   iterations start..stop of EXPERT_STATISTIC_ITER_RANGE, stop included.
# - fused_moe (both trees): with a load_balancer config the statistics are
#   taken from token_selected_slots with expert_count = num_slots, so
#   meta_info.json says num_experts = 72 and every id is a slot.
import json, os, random, struct

random.seed(38)
T, MOE, E, P, G, K = 128, list(range(2, 10)), 64, 72, 8, 6
lines = open("../flame-moe-290m/trace.jsonl").read().splitlines()[1:1 + T]
tokens = [json.loads(l)["layers"] for l in lines]  # [T][8][6], logical


def save_file(path, tensors):
    """tensors: key -> (dtype, shape, flat ints), as safetensors writes them."""
    fmt = {"I64": "q", "I32": "i"}
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for key in sorted(tensors):
        dtype, shape, flat = tensors[key]
        raw = struct.pack("<%d%s" % (len(flat), fmt[dtype]), *flat)
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def dump(folder, num_experts, ranks):
    """ranks: r -> {iteration: [per token: {layer: [k ids]}]}."""
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/meta_info.json", "w") as f:
        json.dump({"num_experts": num_experts, "num_experts_per_token": K}, f)
    for r, iters in ranks.items():
        counts, raw = {}, {}
        for it, toks in iters.items():
            for l in MOE:
                key = f"{it}_{l}"
                c = [0] * num_experts
                flat = []
                for tok in toks:
                    for i in tok[l]:
                        c[i] += 1
                    flat += tok[l]
                counts[key] = ("I64", [num_experts], c)
                raw[key] = ("I32", [len(toks), K], flat)
        save_file(f"{folder}/rank{r}.safetensors", counts)
        save_file(f"{folder}/rank{r}_raw.safetensors", raw)


def logical(t):
    return {l: tokens[t][l - 2] for l in MOE}


expected = {"moe_layers": MOE, "experts": E, "top_k": K, "slots": P, "ranks": G}

# 1. trtllm_raw: EXPERT_STATISTIC_ITER_RANGE=100-103 at 7ce477f (stop
# included: 4 iterations); ranks 0 and 1, 16 tokens per iteration each.
ranks = {r: {100 + it: [logical(it * 32 + r * 16 + j) for j in range(16)] for it in range(4)} for r in range(2)}
dump("trtllm_raw", E, ranks)
expected["trtllm_raw"] = {"iterations": [100, 103], "token_order": {str(r): [it * 32 + r * 16 + j for it in range(4) for j in range(16)] for r in range(2)}}

# 2. trtllm_load_balancer: 8 ranks, iterations 100-101, 8 tokens per
# iteration and rank, ids are slots of the static placement below.
layout = {}
for l in MOE:
    load = [0] * E
    for t in tokens:
        for e in t[l - 2]:
            load[e] += 1
    hot = sorted(range(E), key=lambda e: (-load[e], e))[:P - E]
    while True:
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
    layout[l] = [e for g in range(G) for e in slots[g]]
copies = {l: {} for l in MOE}
for l in MOE:
    for s, e in enumerate(layout[l]):
        copies[l].setdefault(e, []).append(s)


def slotted(t):
    return {l: [random.choice(copies[l][e]) for e in tokens[t][l - 2]] for l in MOE}


order = {r: [it * 64 + r * 8 + j for it in range(2) for j in range(8)] for r in range(G)}
ranks = {r: {100 + it: [slotted(it * 64 + r * 8 + j) for j in range(8)] for it in range(2)} for r in range(G)}
dump("trtllm_load_balancer", P, ranks)
with open("trtllm_load_balancer.yaml", "w") as f:
    f.write("num_slots: %d\ninitial_global_assignments:\n" % P)
    for l in MOE:
        f.write("  %d: [%s]\n" % (l, ", ".join(map(str, layout[l]))))
    f.write("layer_updates_per_iter: 0\n")
expected["trtllm_load_balancer"] = {"iterations": [100, 101], "placement": "trtllm_load_balancer.yaml",
                                    "token_order": {str(r): order[r] for r in range(G)},
                                    "slot_load_moe_layers": [[sum(1 for r in ranks for it in ranks[r] for tok in ranks[r][it] for s in tok[l] if s == p) for p in range(P)] for l in MOE]}

# 3. trtllm_no_attention_dp: without enable_attention_dp every rank routes
# every token, so the 4 ranks write the same files (iteration 100, 32
# tokens).
same = {100: [logical(t) for t in range(32)]}
dump("trtllm_no_attention_dp", E, {r: same for r in range(4)})
expected["trtllm_no_attention_dp"] = {"iterations": [100, 100], "tokens": list(range(32)), "ranks_written": 4}

with open("trtllm_expected.json", "w") as f:
    json.dump(expected, f, indent=1)
    f.write("\n")
