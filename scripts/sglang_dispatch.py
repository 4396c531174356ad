#!/usr/bin/env python3
"""Recompute SGLang's static dispatch table with Python's own `random`.

    python3 scripts/sglang_dispatch.py IN.json [OUT.json]
    python3 scripts/sglang_dispatch.py --random SEED [OUT.json]

IN.json holds
    {"phy2log": [layer][physical id] -> logical expert, "experts": E}
 or {"candidates": [layer][expert] -> [physical ids], "num_physical": P},
(for init_by_eplb, "candidates" are the EPLB algorithm's log2phy rows in
its replica order, as init_by_eplb hands them over; -1 padding is dropped,
as _logical_to_all_physical_raw drops it)
plus "ep_size", "gpus_per_node", "variant" (sglang-static,
sglang-static-node, sglang-static-node-narrow, sglang-static-gpu-only) and
"init" (init_by_mapping or init_by_eplb; default init_by_mapping). It prints
(or writes to OUT.json) the input with "table": [rank][layer][expert] ->
physical id added.

--random SEED writes a random case instead (shape and map drawn from SEED)
and its table; the Go tests use it to compare on maps nobody chose. An
init_by_eplb case gives its candidate lists in a random replica order.

This is an independent restatement of what SGLang's
compute_logical_to_rank_dispatch_physical_map and _find_nearest_expert
(python/sglang/srt/eplb/expert_location.py) do, written from the algorithm
and standard library only:
  * one random.Random(42); layers in order, experts in order;
  * per rank, the "nearest" copy: sglang-static takes the first copy on the
    rank's GPU; the newer trees first return the only copy when there is one,
    then the first copy on the rank's GPU, then (node trees) the first copy on
    the rank's node (the narrow tree only when the node holds some but not
    all copies);
  * the ranks with no nearest copy, in rank order, get
    arr * (k // n) + rnd.sample(arr, k % n), shuffled by rnd.shuffle;
  * with init_by_eplb (ExpertLocationMetadata.init_by_eplb; sgl-project/
    sglang python/sglang/srt/eplb/expert_location.py@01fec5c2e61f9568c41a
    6e1d4fd5ac46c88504f1) the candidate lists are the algorithm's log2phy
    rows, unchanged and in its order, and one pass serves every rank;
  * with init_by_mapping (the newer trees), each rank first narrows every
    candidate list to its own nearest copy and runs the whole pass on those
    lists, keeping only its own row. This script literally runs one pass per
    rank, where the Go code shares passes between ranks.
Slot p lives on GPU p // (P // ep_size).
"""
import json
import random
import sys

VARIANTS = ("sglang-static", "sglang-static-node", "sglang-static-node-narrow",
            "sglang-static-gpu-only")


def nearest(copies, rank, per_gpu, gpus_per_node, variant):
    """The copy a rank keeps for itself, or None when the rank is dealt."""
    if variant != "sglang-static" and len(copies) == 1:
        return copies[0]
    own = [p for p in copies if p // per_gpu == rank]
    if own:
        return own[0]
    if variant in ("sglang-static-node", "sglang-static-node-narrow"):
        per_node = per_gpu * gpus_per_node
        node = rank // gpus_per_node
        local = [p for p in copies if p // per_node == node]
        if variant == "sglang-static-node" and local:
            return local[0]
        if variant == "sglang-static-node-narrow" and 0 < len(local) < len(copies):
            return local[0]
    return None


def deal(copies, k, rnd):
    whole, rest = divmod(k, len(copies))
    picks = list(copies) * whole + rnd.sample(copies, k=rest)
    rnd.shuffle(picks)
    return picks


def one_pass(cands, ep_size, per_gpu, gpus_per_node, variant):
    """Every rank's row from one pass over the given lists (one stream)."""
    rnd = random.Random(42)
    layers, experts = len(cands), len(cands[0])
    out = [[[None] * experts for _ in range(layers)] for _ in range(ep_size)]
    for layer in range(layers):
        for expert in range(experts):
            copies = cands[layer][expert]
            left = []
            for rank in range(ep_size):
                got = nearest(copies, rank, per_gpu, gpus_per_node, variant)
                if got is None:
                    left.append(rank)
                else:
                    out[rank][layer][expert] = got
            # The plain tree calls the deal even with nobody left (it then
            # draws nothing); the newer trees skip it. Same stream either way.
            if left or variant == "sglang-static":
                for rank, got in zip(left, deal(copies, len(left), rnd)):
                    out[rank][layer][expert] = got
    return out


def table(cands, ep_size, per_gpu, gpus_per_node, variant, init):
    if variant not in VARIANTS:
        raise SystemExit(f"sglang_dispatch: unknown variant {variant!r}")
    if variant == "sglang-static" or init == "init_by_eplb":
        return one_pass(cands, ep_size, per_gpu, gpus_per_node, variant)
    if init != "init_by_mapping":
        raise SystemExit(f"sglang_dispatch: unknown init {init!r}")
    rows = []
    for rank in range(ep_size):
        narrowed = []
        for layer_cands in cands:
            row = []
            for copies in layer_cands:
                got = nearest(copies, rank, per_gpu, gpus_per_node, variant)
                row.append([got] if got is not None else list(copies))
            narrowed.append(row)
        rows.append(one_pass(narrowed, ep_size, per_gpu, gpus_per_node, variant)[rank])
    return rows


def candidates_of(phy2log, experts):
    cands = []
    for row in phy2log:
        lists = [[] for _ in range(experts)]
        for p, e in enumerate(row):
            lists[e].append(p)
        cands.append(lists)
    return cands


def solve(case):
    ep_size = case["ep_size"]
    if "phy2log" in case:
        cands = candidates_of(case["phy2log"], case["experts"])
        num_physical = len(case["phy2log"][0])
    else:
        cands = [[[p for p in c if p != -1] for c in layer] for layer in case["candidates"]]
        num_physical = case["num_physical"]
    per_gpu = num_physical // ep_size
    return table(cands, ep_size, per_gpu, case["gpus_per_node"], case["variant"],
                 case.get("init", "init_by_mapping"))


def random_case(seed):
    """A random map: shape, copy counts and slots all drawn from seed."""
    g = random.Random(seed)
    nodes = g.choice([1, 2, 4])
    gpus_per_node = g.choice([1, 2, 4, 8])
    ep_size = nodes * gpus_per_node
    per_gpu = g.choice([1, 2, 3, 5, 9])
    num_physical = ep_size * per_gpu
    experts = g.randint(max(1, num_physical // 3), num_physical)
    layers = g.randint(1, 4)
    phy2log = []
    for _ in range(layers):
        row = list(range(experts)) + [g.randrange(experts) for _ in range(num_physical - experts)]
        if g.random() < 0.3 and num_physical - experts > 1:
            hot = g.randrange(experts)  # one expert with many copies
            for i in range(experts, num_physical):
                row[i] = hot if g.random() < 0.8 else row[i]
        g.shuffle(row)
        phy2log.append(row)
    case = {
        "phy2log": phy2log, "experts": experts, "ep_size": ep_size,
        "gpus_per_node": gpus_per_node, "variant": g.choice(VARIANTS),
        "init": g.choice(["init_by_mapping", "init_by_eplb"]),
    }
    if case["init"] == "init_by_eplb":
        # EPLB's log2phy order: each expert's copies in replica order, which
        # need not be ascending.
        cands = candidates_of(phy2log, experts)
        for layer in cands:
            for copies in layer:
                g.shuffle(copies)
        del case["phy2log"], case["experts"]
        case["candidates"], case["num_physical"] = cands, num_physical
    return case


def main(argv):
    if len(argv) >= 3 and argv[1] == "--random":
        case = random_case(int(argv[2]))
        out = argv[3] if len(argv) > 3 else None
    elif len(argv) in (2, 3):
        with open(argv[1]) as f:
            case = json.load(f)
        out = argv[2] if len(argv) > 2 else None
    else:
        raise SystemExit(__doc__)
    case["table"] = solve(case)
    text = json.dumps(case, separators=(",", ":")) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
