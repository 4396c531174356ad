#!/usr/bin/env python3
"""Writes golden.json: what CPython's random.Random returns for a fixed script
of calls, so pyrand's tests can check the Go port without Python.

Rerun from the repository root:  python3 internal/pyrand/testdata/gen.py
Every call of one case draws from the same Random, in the order listed, so a
wrong number of words drawn anywhere shows up in every later value.
"""
import json
import os
import random
import sys

SEEDS = [42, 0, 1, -5, 2**32 + 7, 123456789012, -(2**63)]

N_LIST = (list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 1000, 1023, 1024,
          1025, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1,
          3 * 2**33 + 5, 2**40 + 3, 2**62 + 11, 2**63 - 1])

SAMPLES = [(1, 0), (1, 1), (5, 3), (8, 8), (21, 5), (22, 5), (22, 2), (30, 4),
           (85, 6), (86, 6), (100, 10), (300, 20), (40, 39), (1000, 3), (7, 0)]

SHUFFLES = [0, 1, 2, 3, 10, 31, 64, 300]


def case(seed):
    r = random.Random(seed)
    out = {"seed": seed}
    out["uint32"] = [r.getrandbits(32) for _ in range(700)]  # crosses a twist
    out["bits"] = [[k, str(r.getrandbits(k))] for k in
                   [1, 5, 31, 32, 33, 48, 63, 64, 65, 100, 0, 7]]
    out["randbelow"] = [[n, r._randbelow(n)] for n in N_LIST for _ in range(3)]
    out["sample"] = [[n, k, r.sample(range(n), k)] for n, k in SAMPLES]
    shuffles = []
    for m in SHUFFLES:
        x = list(range(m))
        r.shuffle(x)
        shuffles.append([m, x])
    out["shuffle"] = shuffles
    out["after"] = r.getrandbits(32)
    return out


def main():
    doc = {
        "python": sys.version.split()[0],
        "command": "python3 internal/pyrand/testdata/gen.py",
        "cases": [case(s) for s in SEEDS],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
