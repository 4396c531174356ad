#!/usr/bin/env python3
"""Write a logical_count JSON of Zipf expert loads, to shape synthetic traces.

    python3 scripts/zipf_counts.py --layers 94 --experts 128 --zipf 0.9 --seed 7 > counts.json

Every layer ranks its experts in a fresh random order (seeded) and gives the
expert of rank r the load 1000 / r**zipf. The output has the shape of
EPLB's and SGLang's {"logical_count": [layers][experts]} dumps, so count
readers and trace generators that take such files accept it. Standard
library only.
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--experts", type=int, required=True)
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the loads (0: uniform)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.layers < 1 or a.experts < 1:
        sys.exit("zipf_counts: --layers and --experts must be at least 1")
    r = random.Random(a.seed)
    rows = []
    for _ in range(a.layers):
        order = list(range(a.experts))
        r.shuffle(order)
        row = [0.0] * a.experts
        for rank, e in enumerate(order):
            row[e] = 1000.0 / (rank + 1) ** a.zipf
        rows.append(row)
    json.dump({"logical_count": rows}, sys.stdout)


if __name__ == "__main__":
    main()
