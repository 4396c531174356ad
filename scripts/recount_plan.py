#!/usr/bin/env python3
"""Score an SGLang placement on a per-token trace with no moetuner code.

    python3 scripts/recount_plan.py TRACE.npy PLAN.sglang.json --gpus 32 --gpus-per-node 8
    python3 scripts/recount_plan.py TRACE.npy PLAN.sglang.json --gpus 32 --gpus-per-node 8 \
        --dispatch sglang-static-node-narrow [--json]

TRACE.npy is an integer array [tokens][MoE layers][top-k] of expert ids
(NumPy format, little-endian, C order); its sibling TRACE.source.npy, an
integer array [tokens], gives each token's source rank (its home GPU).
PLAN.sglang.json holds {"physical_to_logical_map": [decoder layers][slots]};
slot p is on GPU p // (slots / G), and the trace's MoE layers are the map's
last rows (DeepSeek-V3: decoder layers 3..60).

Prints, as means over the MoE layers:
  busiest/mean (even): the busiest GPU's tokens over the mean, an expert's
      tokens split evenly over its copies;
  busiest/mean (static): the same under SGLang's static dispatch (a source
      uses the copy on its own GPU when there is one, otherwise each copy
      with probability 1/n);
  remote nodes per token (static): the expected number of nodes other than
      the token's own that receive at least one of its copies, per token and
      layer (each expert's copy drawn independently as above);
and the worst layer's busiest/mean.

--dispatch sglang-static, sglang-static-node, sglang-static-node-narrow or
sglang-static-gpu-only instead counts every token as SGLang's static
dispatch sends it: the table ([rank][decoder layer][expert] -> physical id)
is built by sglang_dispatch.py (same directory; Python's own random,
seeded with 42, init_by_mapping) from EVERY row of the map, dense rows
included, since SGLang deals every decoder layer's row
(ModelConfigForExpertLocation.num_layers is num_hidden_layers) and those
deals draw from the one stream before the MoE layers'. Each token of
source rank h and expert e then goes, whole, to the GPU of table[h][row][e].
A trace without sources has every rank send an equal share of every token.
It prints the busiest GPU's tokens over the mean per layer, averaged over
the MoE layers, and the worst layer; --json prints them as
{"dispatch", "mean_balance", "max_balance", "layers": [busiest/mean],
"busiest_tokens": [the busiest GPU's tokens]} instead.

--init init_by_eplb deals the table as SGLang does when it ran its EPLB
algorithm itself (init_by_eplb): PLAN.sglang.json must then also hold
"logical_to_all_physical_map": [decoder layers][expert][replica] -> physical
id (-1 padded), the algorithm's log2phy in its replica order, and the
candidate lists are those rows (one random stream for every rank). The
default, init_by_mapping, is a map loaded from a file.

--moe-rows R0,R1,... names the map rows of the trace's MoE layers when they
are not the last ones. Standard library only.
"""
import argparse
import array
import ast
import json
import os
import struct
import sys

import sglang_dispatch  # same directory: sys.path[0] is this script's


def read_npy(path):
    with open(path, "rb") as f:
        magic = f.read(6)
        if magic != b"\x93NUMPY":
            sys.exit(f"{path}: not a .npy file")
        major, _ = f.read(2)
        n = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(n).decode("latin1"))
        if header["fortran_order"]:
            sys.exit(f"{path}: Fortran order is not supported")
        codes = {"<i1": "b", "|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q", "|u1": "B", "<u2": "H"}
        code = codes.get(header["descr"])
        if code is None:
            sys.exit(f"{path}: dtype {header['descr']} is not supported")
        a = array.array(code)
        a.frombytes(f.read())
        if sys.byteorder != "little":
            a.byteswap()
        return a, tuple(header["shape"])


def dealt(ids, shape, src, full, moe_rows, G, P, variant, log2phy=None):
    """Per MoE layer, (busiest/mean, busiest GPU's tokens) with every token
    sent as SGLang's table says (init_by_eplb on log2phy when given)."""
    T, L, K = shape
    experts = max(max(r) for r in full) + 1
    per = len(full[0]) // G
    if log2phy is None:
        cands = sglang_dispatch.candidates_of(full, experts)
        tab = sglang_dispatch.table(cands, G, per, P, variant, "init_by_mapping")
    else:
        cands = [[[p for p in c if p != -1] for c in layer] for layer in log2phy]
        tab = sglang_dispatch.table(cands, G, per, P, variant, "init_by_eplb")
    out = []
    for l, row in enumerate(moe_rows):
        load = [0.0] * G
        gpu = [[tab[h][row][e] // per for e in range(experts)] for h in range(G)]
        for t in range(T):
            base = (t * L + l) * K
            if src is None:
                for h in range(G):
                    for e in ids[base:base + K]:
                        load[gpu[h][e]] += 1.0 / G
                continue
            mine = gpu[src[t]]
            for e in ids[base:base + K]:
                load[mine[e]] += 1
        out.append((max(load) / (T * K / G), max(load)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("plan")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--dispatch", choices=sglang_dispatch.VARIANTS)
    ap.add_argument("--moe-rows")
    ap.add_argument("--init", choices=("init_by_mapping", "init_by_eplb"), default="init_by_mapping")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ids, shape = read_npy(a.trace)
    T, L, K = shape
    src_path = a.trace[:-4] + ".source.npy"
    src = read_npy(src_path)[0] if os.path.exists(src_path) else None
    if src is not None and len(src) != T:
        sys.exit(f"{src_path}: {len(src)} sources for {T} tokens")
    with open(a.plan) as f:
        doc = json.load(f)
    full = doc["physical_to_logical_map"]
    log2phy = None
    if a.init == "init_by_eplb":
        if not a.dispatch:
            sys.exit("--init init_by_eplb needs --dispatch")
        log2phy = doc.get("logical_to_all_physical_map")
        if log2phy is None or len(log2phy) != len(full):
            sys.exit(f"{a.plan}: --init init_by_eplb needs logical_to_all_physical_map with one row per map row")
    G, P = a.gpus, a.gpus_per_node
    if len(full[0]) % G:
        sys.exit(f"{a.plan}: {len(full[0])} slots do not divide over {G} GPUs")
    if src is not None and any(h < 0 or h >= G for h in src):
        sys.exit(f"{src_path}: a source rank is outside [0,{G})")
    if a.moe_rows:
        moe_rows = [int(x) for x in a.moe_rows.split(",")]
    else:
        moe_rows = list(range(len(full) - L, len(full)))
    if len(moe_rows) != L or min(moe_rows) < 0 or max(moe_rows) >= len(full):
        sys.exit(f"{a.plan}: {len(full)} map rows cannot hold the trace's {L} MoE layers at rows {moe_rows}")
    if a.dispatch:
        per_layer = dealt(ids, shape, src, full, moe_rows, G, P, a.dispatch, log2phy)
        bal = [b for b, _ in per_layer]
        mean, worst = sum(bal) / L, max(bal)
        if a.json:
            print(json.dumps({"dispatch": a.dispatch, "init": a.init, "mean_balance": mean, "max_balance": worst,
                              "layers": bal, "busiest_tokens": [m for _, m in per_layer]}))
        else:
            print(f"layers {L}, tokens {T}, top-{K}, {G} GPUs ({G // P} nodes)")
            print(f"busiest/mean ({a.dispatch}, as dealt): mean {mean:.4f}, worst layer {worst:.4f}")
        return
    rows = [full[r] for r in moe_rows]
    even_sum = static_sum = worst = remote = 0.0
    for l in range(L):
        row = rows[l]
        per = len(row) // G
        gpus_of = {}
        for p, e in enumerate(row):
            gpus_of.setdefault(e, []).append(p // per)
        load_even = [0.0] * G
        load_static = [0.0] * G
        rem = 0.0
        for t in range(T):
            h = src[t] if src is not None else None
            base = (t * L + l) * K
            miss = {}  # node -> probability that no copy reaches it
            for e in ids[base:base + K]:
                gs = gpus_of[e]
                w = 1.0 / len(gs)
                for g in gs:
                    load_even[g] += w
                if h is not None and h in gs:
                    load_static[h] += 1
                    q = {h // P: 1.0}
                else:
                    q = {}
                    for g in gs:
                        load_static[g] += w
                        q[g // P] = q.get(g // P, 0.0) + w
                for b, qb in q.items():
                    miss[b] = miss.get(b, 1.0) * (1 - qb)
            if h is not None:
                rem += sum(1 - m for b, m in miss.items() if b != h // P)
        mean = T * K / G
        even_sum += max(load_even) / mean
        static_sum += max(load_static) / mean
        worst = max(worst, max(load_even) / mean)
        remote += rem / T
    print(f"layers {L}, tokens {T}, top-{K}, {G} GPUs ({G // P} nodes)")
    print(f"busiest/mean (even):   mean {even_sum / L:.4f}, worst layer {worst:.4f}")
    print(f"busiest/mean (static): mean {static_sum / L:.4f}")
    if src is not None:
        print(f"remote nodes per token (static): {remote / L:.4f}")


if __name__ == "__main__":
    main()
