#!/usr/bin/env python3
"""Re-score the placements `moetuner backtest --plans-dir DIR` wrote, with no moetuner code.

    python3 scripts/rescore_plans.py SERIES.json DIR [--gpus G] [--first-step T]

SERIES.json is the per-step load file the backtest read (SGLang logical_count,
[steps][decoder layers][experts]); DIR/POLICY/step-NNNNNN.sglang.json are SGLang
physical_to_logical_map files, each in force from step NNNNNN until the next.
For every policy it prints the mean over the scored steps and the MoE layers of
busiest/mean GPU load (PAR: slot p on GPU p // (P / G), an expert's tokens split
evenly over its copies) and the slots that differ between consecutive files.
Standard library only.
"""
import argparse
import json
import os
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("series")
    ap.add_argument("plans_dir")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--first-step", type=int, default=None,
                    help="first scored step (default: the first file's step)")
    a = ap.parse_args()
    with open(a.series) as f:
        steps = json.load(f)["logical_count"]
    # The MoE layers are the rows with any load (dense rows are all zero).
    moe = [l for l in range(len(steps[0])) if any(any(s[l]) for s in steps)]
    # Steps without any load (an unfilled recorder buffer) are dropped, as
    # the backtest does.
    steps = [s for s in steps if any(any(row) for row in s)]
    for policy in sorted(os.listdir(a.plans_dir)):
        d = os.path.join(a.plans_dir, policy)
        files = sorted(f for f in os.listdir(d) if re.fullmatch(r"step-\d+\.sglang\.json", f))
        starts = [int(f[5:11]) for f in files]
        maps = []
        for f in files:
            with open(os.path.join(d, f)) as fh:
                m = json.load(fh)["physical_to_logical_map"]
            maps.append([m[l] for l in moe])
        moved = sum(a != b for i in range(1, len(maps))
                    for ra, rb in zip(maps[i - 1], maps[i]) for a, b in zip(ra, rb))
        first = starts[0] if a.first_step is None else a.first_step
        total, n, k = 0.0, 0, 0
        for s in range(first, len(steps)):
            while k + 1 < len(starts) and starts[k + 1] <= s:
                k += 1
            for li, row in enumerate(maps[k]):
                load = steps[s][moe[li]]
                per = len(row) // a.gpus
                copies = {}
                for e in row:
                    copies[e] = copies.get(e, 0) + 1
                gpu = [0.0] * a.gpus
                for p, e in enumerate(row):
                    gpu[p // per] += load[e] / copies[e]
                mean = sum(gpu) / a.gpus
                total += max(gpu) / mean if mean > 0 else 1.0
                n += 1
        print(f"{policy:16s} mean PAR {total / n:.6f}  slots moved {moved}  plans {len(files)}")


if __name__ == "__main__":
    main()
