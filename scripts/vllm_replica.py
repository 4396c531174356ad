#!/usr/bin/env python3
"""vLLM's hashed replica choice, computed two ways, written as golden values.

    /usr/bin/python3 scripts/vllm_replica.py internal/stackdispatch/testdata/vllm/golden.json

vLLM's _eplb_map_and_record_i32_kernel (vllm/distributed/eplb/
cuda_platform_backend.py) picks, for the token in row t of a rank's topk_ids,
replica ((t * 2654435769) & 0xFFFFFFFF) % replica_count in int64. This script
computes that with numpy uint32 arithmetic (the product wraps mod 2**32) and,
when torch is importable, with torch int64 tensors as the kernel does, checks
that both agree, and writes {"cases": [[token, copies, replica], ...]}.
Needs numpy.
"""
import json
import sys

import numpy as np

KNUTH = 2654435769


def by_numpy(tokens, copies):
    t = np.asarray(tokens, dtype=np.uint64).astype(np.uint32)  # low 32 bits of t
    h = t * np.uint32(KNUTH)  # uint32 product wraps mod 2**32
    return (h.astype(np.uint64) % np.asarray(copies, dtype=np.uint64)).tolist()


def by_torch(tokens, copies):
    import torch
    t = torch.tensor(tokens, dtype=torch.int64)
    h = (t * KNUTH) & 0xFFFFFFFF
    return (h % torch.tensor(copies, dtype=torch.int64)).tolist()


def main(path):
    tokens, copies = [], []
    for t in list(range(0, 1100)) + [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 7, 3 * 2**33 + 1, 10**12 + 3]:
        for c in (1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64):
            tokens.append(t)
            copies.append(c)
    got = by_numpy(tokens, copies)
    try:
        other = by_torch(tokens, copies)
    except ImportError:
        other = None
    if other is not None and other != got:
        raise SystemExit("vllm_replica: numpy and torch disagree")
    doc = {"checked_with_torch": other is not None,
           "command": "/usr/bin/python3 scripts/vllm_replica.py internal/stackdispatch/testdata/vllm/golden.json",
           "cases": [[t, c, r] for t, c, r in zip(tokens, copies, got)]}
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
