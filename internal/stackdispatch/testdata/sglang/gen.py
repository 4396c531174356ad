#!/usr/bin/env python3
"""Writes the golden SGLang static tables the Go tests compare with.

Rerun from the repository root:
    python3 internal/stackdispatch/testdata/sglang/gen.py

Each case is a map (drawn here from a fixed seed, or written out) and, for
every variant and init, the table scripts/sglang_dispatch.py computes with
Python's own random.
"""
import importlib.util
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
spec = importlib.util.spec_from_file_location(
    "sglang_dispatch", os.path.join(ROOT, "scripts", "sglang_dispatch.py"))
sd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sd)

COMBOS = [("sglang-static", "init_by_mapping")] + [
    (v, i) for v in sd.VARIANTS[1:] for i in ("init_by_mapping", "init_by_eplb")]


def random_map(seed, layers, ep_size, per_gpu, experts, hot=None):
    """Every expert once, the redundant slots drawn; hot=(expert, copies) gives
    one expert that many copies on distinct GPUs in layer 0."""
    g = random.Random(seed)
    num_physical = ep_size * per_gpu
    out = []
    for layer in range(layers):
        row = list(range(experts)) + [g.randrange(experts) for _ in range(num_physical - experts)]
        g.shuffle(row)
        if hot is not None and layer == 0:
            e, copies = hot
            gpus = g.sample(range(ep_size), copies)
            for p in range(num_physical):
                if row[p] == e:
                    row[p] = g.randrange(experts)
            for gpu in gpus:
                row[gpu * per_gpu + g.randrange(per_gpu)] = e
            for missing in set(range(experts)) - set(row):
                # put back an expert the hot copies overwrote, on a slot whose
                # expert still has another copy and which is not a hot copy
                for p in range(num_physical):
                    if row[p] != e and row.count(row[p]) > 1:
                        row[p] = missing
                        break
        out.append(row)
    return out


def cases():
    yield "4x2nodes", {"phy2log": random_map(1, 3, 4, 3, 8), "experts": 8,
                       "ep_size": 4, "gpus_per_node": 2}
    yield "32x4nodes_288", {"phy2log": random_map(2, 2, 32, 9, 256), "experts": 256,
                            "ep_size": 32, "gpus_per_node": 8}
    # copies sharing a GPU: expert 0 twice on GPU 0, expert 1 twice on GPU 3
    yield "shared_gpu", {"phy2log": [[0, 0, 2, 3, 4, 5, 1, 1, 6, 7, 2, 3, 5, 6, 7, 4],
                                     [1, 2, 2, 0, 3, 3, 4, 5, 6, 6, 6, 7, 0, 1, 5, 4]],
                         "experts": 8, "ep_size": 8, "gpus_per_node": 4}
    # expert 5 with 30 copies on 30 GPUs of 32: two ranks dealt over n = 30 > 21
    # candidates, so random.sample takes its set branch
    yield "set_branch", {"phy2log": random_map(3, 2, 32, 2, 30, hot=(5, 30)), "experts": 30,
                         "ep_size": 32, "gpus_per_node": 8}
    # explicit candidate lists in a non-ascending (EPLB log2phy) order
    g = random.Random(4)
    cands = []
    for _ in range(2):
        slots = list(range(24))
        g.shuffle(slots)
        lists = [[s] for s in slots[:12]]
        for s in slots[12:]:
            lists[g.randrange(12)].append(s)
        cands.append(lists)
    yield "explicit_order", {"candidates": cands, "num_physical": 24, "ep_size": 6,
                             "gpus_per_node": 3}


def main():
    for name, case in cases():
        tables = {}
        for variant, init in COMBOS:
            c = dict(case, variant=variant, init=init)
            tables[variant + "/" + init] = sd.solve(c)
        doc = dict(case, tables=tables,
                   command="python3 internal/stackdispatch/testdata/sglang/gen.py")
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
