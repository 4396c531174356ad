#!/usr/bin/env python3
"""Score an SGLang placement on a per-token trace with no moetuner code.

    python3 scripts/recount_plan.py TRACE.npy PLAN.sglang.json --gpus 32 --gpus-per-node 8

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
and the worst layer's busiest/mean. Standard library only.
"""
import argparse
import array
import ast
import json
import os
import struct
import sys


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("plan")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    a = ap.parse_args()
    ids, shape = read_npy(a.trace)
    T, L, K = shape
    src_path = a.trace[:-4] + ".source.npy"
    src = read_npy(src_path)[0] if os.path.exists(src_path) else None
    with open(a.plan) as f:
        rows = json.load(f)["physical_to_logical_map"]
    rows = rows[len(rows) - L:]
    G, P = a.gpus, a.gpus_per_node
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
