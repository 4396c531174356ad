#!/usr/bin/env python3
"""Oracles for the ports of the serving stacks' own placement algorithms.

deepseek_vec: a transcription, with the same PyTorch operations (so that
PyTorch's own sums, max, argmin and sort decide the numerics and ties), of
SGLang's python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py at
sgl-project/sglang@68836b60f99d117ec96b5c8d7e49400724f25aca.

flashlb: a transcription in plain NumPy of vllm-ascend's
vllm_ascend/eplb/core/policy/policy_flashlb.py at
vllm-project/vllm-ascend@0834773c34252cfd664072378b3265accb83369f
(compute_piece_counts, jsq_placement, group_based_adaptive_bloating_kernel,
group_based_adaptive_bloating). Upstream runs these under numba; this script
mirrors numba's types (float32 arrays, float64 scalars, float32 / int64
giving float64) and numba's np.argsort (numba/misc/quicksort.py), so it does
not need numba.

Usage: python3 scripts/peers_oracle.py [--out testdata/peers]
writes deepseek_vec.json and flashlb.json, the golden cases the Go tests in
baseline/ compare against. Needs numpy; deepseek_vec also needs torch.
"""

import argparse
import json
import os
import random

import numpy as np

# --------------------------------------------------------------------------
# deepseek_vec


def _vec_chunkwise(torch, tok, P, K, C):
    """make_redundant_experts_chunkwise: tok is [S, L, E] float32."""
    S, L, E = tok.shape
    R = P - E
    chunks = P // C
    assert P % C == 0 and E % chunks == 0 and R % chunks == 0
    epg, rpg = E // chunks, R // chunks
    phy = torch.empty(L, P, dtype=torch.int)
    l2p = torch.full((L, E, R + 1), -1, dtype=torch.int)
    cnt = torch.ones(L, E, dtype=torch.int)
    ar_lc = torch.arange(L * chunks, dtype=torch.int)
    ar_e = torch.arange(E, dtype=torch.int)
    ar_epg = torch.arange(epg, dtype=torch.int)
    ar_c = torch.arange(chunks, dtype=torch.int)
    phy.view(L, chunks, C)[:, :, :epg] = ar_e.view(chunks, epg)
    l2p[:, :, 0] = (ar_epg.expand(chunks, epg) + ar_c[:, None] * C).view(E)
    diff = tok + ar_e * 1e-4
    for i in range(rpg):
        sc = (diff / cnt).view(S, L, chunks, epg)
        sc1 = (tok / (cnt + 1)).view_as(sc)
        v, ix = sc.max(-1, keepdim=True)
        v = v.expand_as(sc).contiguous()
        sc.scatter_(-1, ix, sc1.gather(-1, ix))
        v.scatter_(-1, ix, sc.max(-1, keepdim=True).values)
        pick = v.sum(0).argmin(-1)
        phy.view(L, chunks, C)[:, :, epg + i] = pick + ar_c * epg
        rc = cnt.view(L * chunks, epg).gather(-1, pick.view(L * chunks, 1)).squeeze(1)
        slot = (ar_c * C + epg + i).expand(L, chunks).flatten()
        # Index tensors as int64: torch 1.13 rejects the int32 ones newer
        # releases accept; the values are the same.
        lc, pk = ar_lc.long(), pick.view(L * chunks).long()
        l2p.view(L * chunks, epg, R + 1)[lc, pk, rc.long()] = slot
        cnt.view(L * chunks, epg)[lc, pk] += 1
    if K > 1:
        p64 = phy.to(torch.int64)
        score = tok.sum(0).gather(-1, p64) / cnt.gather(-1, p64)
        order = score.view(L, chunks, C).argsort(-1, descending=True)
        order += torch.arange(0, P, C, dtype=order.dtype)[None, :, None]
        gpc = C // K
        order = order.view(L, chunks, K, gpc)
        order[:, :, 1::2, :] = order[:, :, 1::2, :].flip(-1)
        order = order.transpose(2, 3).reshape(L, P)
        phy = phy.gather(-1, order)
        mask = l2p == -1
        l2p[mask] = 0
        l2p = order.argsort(-1).gather(-1, l2p.view(L, -1).to(torch.int64)).view_as(l2p).to(torch.int)
        l2p[mask] = -1
    return phy, l2p, cnt


def _vec_pack_groups(torch, gtok, N):
    L, G = gtok.shape
    per = G // N
    order = gtok.float().sort(-1, descending=True).indices
    out = torch.full_like(gtok, -1, dtype=torch.int64)
    for l in range(L):
        ntok, ngr = [0] * N, [0] * N
        for g in order[l]:
            n = min(range(N), key=lambda r: (1, 0) if ngr[r] >= per else (0, ntok[r]))
            out[l, g] = n * per + ngr[n]
            ntok[n] += gtok[l, g]
            ngr[n] += 1
    return out


def deepseek_vec(torch, tokens, P, K, G, N, hierarchical):
    tok = torch.tensor(tokens, dtype=torch.float32)
    if not hierarchical:
        return _vec_chunkwise(torch, tok, P, K, P)
    S, L, E = tok.shape
    gs = E // G
    perm = _vec_pack_groups(torch, tok.sum(0).unflatten(-1, (G, -1)).sum(-1), N)
    l2m = ((perm * gs).unsqueeze(-1) + torch.arange(gs, dtype=torch.int64)).flatten(-2)
    m2l = torch.empty_like(l2m)
    m2l.scatter_(1, l2m, torch.arange(E, dtype=torch.int64).expand(L, -1))
    mtok = tok.gather(2, m2l.unsqueeze(0).expand(S, -1, -1))
    p2m, m2p, mcnt = _vec_chunkwise(torch, mtok, P, K, P // N)
    phy = m2l.gather(1, p2m.to(torch.int64))
    l2p = m2p.gather(1, l2m.unsqueeze(-1).expand(-1, -1, m2p.size(-1)).to(torch.int64))
    cnt = mcnt.gather(1, l2m)
    return phy, l2p, cnt


def vec_cases(torch, rng):
    shapes = [
        # steps, layers, experts, physical, per GPU, groups, nodes, hierarchical
        (1, 2, 12, 16, 2, 4, 2, False),
        (1, 2, 12, 16, 2, 4, 2, True),
        (3, 2, 16, 24, 3, 4, 2, False),
        (5, 3, 16, 24, 3, 4, 2, True),
        (20, 2, 32, 48, 6, 8, 4, True),
        (40, 2, 32, 40, 5, 8, 2, False),
        (70, 1, 64, 80, 10, 8, 2, True),
        (4, 2, 8, 8, 1, 2, 1, False),
        (6, 2, 24, 36, 4, 6, 3, True),
        (300, 1, 16, 24, 3, 4, 2, False),
    ]
    out = []
    for k, (S, L, E, P, K, G, N, h) in enumerate(shapes):
        for variant in range(2):
            if variant == 0:
                # Integer counts, heavy-tailed, with many ties.
                toks = [[[int(rng.paretovariate(1.2) * 10) % 500 for _ in range(E)] for _ in range(L)] for _ in range(S)]
            else:
                toks = [[[rng.choice([0, 1, 2, 3, 5, 8, 100, 101]) for _ in range(E)] for _ in range(L)] for _ in range(S)]
            phy, l2p, cnt = deepseek_vec(torch, toks, P, K, G, N, h)
            out.append({
                "name": f"shape{k}-v{variant}", "tokens": toks, "physical": P, "local": K,
                "groups": G, "nodes": N, "hierarchical": h,
                "phy2log": phy.tolist(), "log2phy": l2p.tolist(), "logcnt": cnt.tolist(),
            })
    return out


# --------------------------------------------------------------------------
# numba's np.argsort (kind="quicksort"), numba/misc/quicksort.py

SMALL_QUICKSORT = 15


def numba_argsort(a):
    a = np.asarray(a)
    R = list(range(len(a)))
    if len(a) < 2:
        return np.array(R, dtype=np.int64)

    def lt(x, y):
        return bool(np.isnan(y)) or x < y if a.dtype.kind == "f" else x < y

    def insertion(low, high):
        for i in range(low + 1, high + 1):
            k = R[i]
            v = a[k]
            j = i
            while j > low and lt(v, a[R[j - 1]]):
                R[j] = R[j - 1]
                j -= 1
            R[j] = k

    def partition(low, high):
        mid = (low + high) >> 1
        if lt(a[R[mid]], a[R[low]]):
            R[low], R[mid] = R[mid], R[low]
        if lt(a[R[high]], a[R[mid]]):
            R[high], R[mid] = R[mid], R[high]
        if lt(a[R[mid]], a[R[low]]):
            R[low], R[mid] = R[mid], R[low]
        pivot = a[R[mid]]
        R[high], R[mid] = R[mid], R[high]
        i, j = low, high - 1
        while True:
            while i < high and lt(a[R[i]], pivot):
                i += 1
            while j >= low and lt(pivot, a[R[j]]):
                j -= 1
            if i >= j:
                break
            R[i], R[j] = R[j], R[i]
            i += 1
            j -= 1
        R[i], R[high] = R[high], R[i]
        return i

    stack = [(0, len(a) - 1)]
    while stack:
        low, high = stack.pop()
        while high - low >= SMALL_QUICKSORT:
            i = partition(low, high)
            if high - i > i - low:
                if high > i:
                    stack.append((i + 1, high))
                high = i - 1
            else:
                if i > low:
                    stack.append((low, i - 1))
                low = i + 1
        insertion(low, high)
    return np.array(R, dtype=np.int64)


# --------------------------------------------------------------------------
# FlashLB (vllm-ascend policy_flashlb.py), numba's types made explicit.

f32, f64 = np.float32, np.float64


def fl_piece_counts(X, P, sw):
    """compute_piece_counts. X is [n_stage, N] (float64 hotness or the
    kernel's float32); sw the stage weights (float64 or float32)."""
    n_stage, N = X.shape
    pieces = np.ones(N, dtype=np.int32)
    unit = X.astype(f64) / pieces  # X / int32 pieces: float64
    for _ in range(P - N):
        deltas = np.zeros(N, dtype=f32)
        for i in range(n_stage):
            idx1 = idx2 = -1
            val1 = val2 = -1.0
            for j in range(N):
                v = unit[i, j]
                if v > val1:
                    val2, idx2 = val1, idx1
                    val1, idx1 = v, j
                elif v > val2:
                    val2, idx2 = v, j
            origin = unit[i, idx1]
            secv = unit[i, idx2]
            alt = f64(X[i, idx1]) / f64(pieces[idx1] + 1)
            delta = origin - (alt if alt > secv else secv)
            add = delta * f64(sw[i]) if delta != 0 else f64(sw[i])
            deltas[idx1] = f32(f64(deltas[idx1]) + add)
        m = int(np.argmax(deltas))
        pieces[m] += 1
        for i in range(n_stage):
            unit[i, m] = f64(X[i, m]) / f64(pieces[m])
    return pieces


def fl_jsq(X, pieces, M, sw):
    """jsq_placement; returns the [M, P/M] deployment (-1 where upstream
    would fill at random)."""
    n_stage, N = X.shape
    per = int(pieces.sum()) // M
    unit = np.empty((n_stage, N), dtype=f32)
    for i in range(N):
        for s in range(n_stage):
            unit[s, i] = f32(f64(X[s, i]) / f64(pieces[i])) if pieces[i] > 0 else f32(0)
    scores = np.zeros(N, dtype=f32)
    for i in range(N):
        for s in range(n_stage):
            scores[i] = f32(scores[i] + unit[s, i])
    idx = numba_argsort(-scores)
    loads = np.zeros((n_stage, M), dtype=f32)
    cnt = np.zeros(M, dtype=np.int32)
    dep = -np.ones((M, per), dtype=np.int32)
    for t in range(N):
        i = int(idx[t])
        used = []
        for _ in range(int(pieces[i])):
            w = unit[:, i].copy()
            smax = loads.max(axis=1).astype(f32)
            denom = np.empty(n_stage, dtype=f32)
            for s in range(n_stage):
                acc = 0.0
                for j in range(M):
                    acc += f64(f32(loads[s, j] + w[s]))
                denom[s] = f32(acc / M + 1e-2)
            best, bestv = -1, 1e30
            for j in range(M):
                if cnt[j] >= per or j in used:
                    continue
                score = 0.0
                for s in range(n_stage):
                    t_sj = f32(loads[s, j] + w[s])
                    num = t_sj if t_sj > smax[s] else smax[s]
                    score += f64(sw[s]) * f64(f32(num / denom[s]))
                if score < bestv:
                    bestv, best = score, j
            if best == -1:
                continue
            used.append(best)
            for s in range(n_stage):
                loads[s, best] = f32(loads[s, best] + w[s])
            dep[best, cnt[best]] = i
            cnt[best] += 1
    return dep


def fl_slices(x, pieces):
    out = []
    for i in range(len(x)):
        v = f32(f64(x[i]) / f64(pieces[i])) if pieces[i] != 0 else f32(np.inf if x[i] > 0 else np.nan)
        out.extend([v] * int(pieces[i]))
    return np.array(out, dtype=f32)


def fl_kernel(X, P, M, sim_pieces, sw):
    """group_based_adaptive_bloating_kernel (X, sw float32)."""
    n_stage, N = X.shape
    groups = P // M
    xall = np.zeros(N, dtype=f32)
    for i in range(n_stage):
        for j in range(N):
            xall[j] = f32(xall[j] + X[i, j])
    order = numba_argsort(-xall)
    Xs = X[:, order]
    sl = np.sort(fl_slices(xall, sim_pieces))[::-1]
    slopes = (sl[: -M + 1].astype(f64) - sl[M - 1:].astype(f64)).astype(f32).astype(f64) / M
    loads = np.zeros(M, dtype=f32)
    pieces = np.zeros(N, dtype=np.int32)
    remain = P - N
    cur = 0
    for _ in range(groups):
        window = Xs[:, cur: cur + 2 * M]
        low = max(0, cur + M - N)
        high = min(remain, M - 1)
        while high - low > 1:
            mid = (high + low) // 2
            keep = M - mid
            grp = window[:, :keep]
            cp = np.maximum(fl_piece_counts(grp, M, sw), 1)
            cs = np.sort(fl_slices(colsum32(grp), cp))
            cl = (loads + cs).astype(f32)
            cl = np.nan_to_num(cl, nan=0.0, posinf=0.0, neginf=0.0)
            cslope = f64(f32(cl.max() - cl.min())) / M
            nslope = slopes[cur + keep:].max()
            if abs(cslope) > abs(nslope):
                low = mid
            else:
                high = mid
        S = high
        keep = M - S
        grp = window[:, :keep]
        cp = fl_piece_counts(grp, M, sw)
        for i in range(keep):
            pieces[order[cur + i]] = cp[i]
        cs = np.sort(fl_slices(colsum32(grp), cp))
        loads = (loads + cs).astype(f32)
        loads = np.sort(loads)[::-1].copy()
        cur += keep
        remain -= S
    return pieces


def colsum32(a):
    out = np.zeros(a.shape[1], dtype=f32)
    for i in range(a.shape[0]):
        out = (out + a[i]).astype(f32)
    return out


def flashlb(X, P, M):
    """group_based_adaptive_bloating(X, P, M, stage_weights, recorsive=False)
    with rebalance_layer's stage weights (each stage's sum over the largest)."""
    X = np.asarray(X, dtype=f64)
    n_stage, N = X.shape
    sums = X.sum(axis=1)
    sw = sums / sums.max() if sums.max() > 0 else np.ones(n_stage)
    sim_p = fl_piece_counts(X, P, sw)
    sim_d = fl_jsq(X, sim_p, M, sw)
    pieces = fl_kernel(X.astype(f32), P, M, sim_p.astype(np.int32), sw.astype(f32))
    dep = fl_jsq(X, pieces, M, sw)
    xall = X.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        unit = np.where(pieces != 0, xall / np.where(pieces != 0, pieces, 1), 0.0)
        simu = xall / sim_p
    load = unit[dep].sum(-1)
    sim_load = simu[sim_d].sum(-1)
    if load.max() > sim_load.max():
        return sim_d, sim_p, True
    return dep, pieces, False


def flashlb_cases(rng):
    out = []
    shapes = [
        # stages, experts, slots, devices
        (1, 8, 16, 8),
        (1, 16, 24, 8),
        (3, 16, 20, 4),
        (4, 32, 48, 8),
        (2, 64, 80, 16),
        (8, 24, 32, 8),
        (1, 12, 12, 4),
        (5, 40, 48, 8),
    ]
    for k, (S, N, P, M) in enumerate(shapes):
        for variant in range(2):
            if variant == 0:
                X = [[int(rng.paretovariate(1.1) * 10) for _ in range(N)] for _ in range(S)]
            else:
                X = [[rng.choice([1, 2, 10, 10, 50, 300]) for _ in range(N)] for _ in range(S)]
            dep, pieces, fallback = flashlb(X, P, M)
            out.append({"name": f"shape{k}-v{variant}", "hotness": X, "slots": P, "devices": M,
                        "deployment": dep.tolist(), "pieces": [int(x) for x in pieces], "simulated": fallback})
    return out


# --------------------------------------------------------------------------
# FlashLB under numba itself (--check-numba): the same steps written with
# the NumPy operations upstream uses and compiled by numba, so that numba,
# not this script, decides every type and runs its own np.argsort. main()
# checks that it agrees with the plain transcription above on every case.


def numba_flashlb():
    from numba import njit

    @njit
    def pieces_nb(X, P, sw):
        n_stage, N = X.shape
        pieces = np.ones(N, dtype=np.int32)
        unit = X / pieces
        for _ in range(P - N):
            deltas = np.zeros(N, dtype=np.float32)
            for i in range(n_stage):
                i1 = -1
                i2 = -1
                v1 = -1.0
                v2 = -1.0
                for j in range(N):
                    v = unit[i, j]
                    if v > v1:
                        v2 = v1
                        i2 = i1
                        v1 = v
                        i1 = j
                    elif v > v2:
                        v2 = v
                        i2 = j
                top = unit[i, i1]
                second = unit[i, i2]
                alt = X[i, i1] / (pieces[i1] + 1)
                d = top - (alt if alt > second else second)
                deltas[i1] += d * sw[i] if np.any(d) != 0 else sw[i]
            m = np.argmax(deltas)
            pieces[m] += 1
            for i in range(n_stage):
                unit[i, m] = X[i, m] / pieces[m]
        return pieces

    @njit
    def jsq_nb(X, pieces, M, sw):
        n_stage, N = X.shape
        per = pieces.sum() // M
        uh = np.empty((n_stage, N), dtype=np.float32)
        for i in range(N):
            if pieces[i] > 0:
                for s in range(n_stage):
                    uh[s, i] = X[s, i] / pieces[i]
            else:
                for s in range(n_stage):
                    uh[s, i] = 0.0
        sc = np.zeros(N, dtype=np.float32)
        for i in range(N):
            for s in range(n_stage):
                sc[i] += uh[s, i]
        idx = np.argsort(-sc)
        loads = np.zeros((n_stage, M), dtype=np.float32)
        cnt = np.zeros(M, dtype=np.int32)
        dep = -np.ones((M, per), dtype=np.int32)
        ptr = np.zeros(M, dtype=np.int32)
        for t in range(N):
            i = idx[t]
            used = list()
            used.append(-1)
            for _ in range(pieces[i]):
                w = np.empty(n_stage, dtype=np.float32)
                for s in range(n_stage):
                    w[s] = uh[s, i]
                smax = np.empty(n_stage, dtype=np.float32)
                for s in range(n_stage):
                    mv = loads[s, 0]
                    for k in range(1, M):
                        if loads[s, k] > mv:
                            mv = loads[s, k]
                    smax[s] = mv
                den = np.empty(n_stage, dtype=np.float32)
                for s in range(n_stage):
                    acc = 0.0
                    for j in range(M):
                        acc += loads[s, j] + w[s]
                    den[s] = acc / M + 1e-2
                best = -1
                bv = 1e30
                for j in range(M):
                    if cnt[j] >= per:
                        continue
                    if j in used:
                        continue
                    score = 0.0
                    for s in range(n_stage):
                        tmp = loads[s, j] + w[s]
                        num = tmp if tmp > smax[s] else smax[s]
                        score += sw[s] * (num / den[s])
                    if score < bv:
                        bv = score
                        best = j
                if best == -1:
                    continue
                used.append(best)
                for s in range(n_stage):
                    loads[s, best] += w[s]
                dep[best, ptr[best]] = i
                ptr[best] += 1
                cnt[best] += 1
        return dep

    @njit
    def slices_nb(x, pieces):
        n = 0
        for i in range(x.shape[0]):
            n += pieces[i]
        out = np.empty(n, dtype=np.float32)
        k = 0
        for i in range(x.shape[0]):
            v = x[i] / pieces[i]
            for _ in range(pieces[i]):
                out[k] = v
                k += 1
        return out

    @njit
    def kernel_nb(X, P, M, sim_pieces, sw):
        n_stage, N = X.shape
        groups = P // M
        xall = np.zeros(N, dtype=np.float32)
        for i in range(n_stage):
            for j in range(N):
                xall[j] += X[i, j]
        order = np.argsort(np.negative(xall))
        Xs = X[:, order]
        sv = np.sort(slices_nb(xall, sim_pieces))[::-1]
        slopes = (sv[:-M + 1] - sv[M - 1:]) / M
        loads = np.zeros(M, dtype=np.float32)
        pieces = np.zeros(N, dtype=np.int32)
        remain = P - N
        cur = 0
        for g in range(groups):
            win = Xs[:, cur: cur + 2 * M]
            low = max(0, cur + M - N)
            high = min(remain, M - 1)
            while (int(high) - int(low)) > 1:
                mid = int((high + low) // 2)
                keep = M - mid
                grp = win[:, :keep]
                cp = pieces_nb(grp, M, sw)
                cp = np.maximum(cp, 1)
                cs = np.sort(slices_nb(grp.sum(0), cp))
                cl = loads + cs
                # np.nan_to_num(cl, nan=0.0, posinf=0.0, neginf=0.0), which
                # numba 0.56 lacks.
                for k in range(cl.shape[0]):
                    if not np.isfinite(cl[k]):
                        cl[k] = 0.0
                cslope = (np.max(cl) - np.min(cl)) / M
                nslope = np.max(slopes[cur + keep:])
                if abs(cslope) > abs(nslope):
                    low = mid
                else:
                    high = mid
            S = high
            keep = M - S
            grp = win[:, :keep]
            cp = pieces_nb(grp, M, sw)
            for i in range(keep):
                pieces[order[cur + i]] = cp[i]
            cs = np.sort(slices_nb(grp.sum(0), cp))
            loads += cs
            loads = np.sort(loads)[::-1]
            cur += keep
            remain -= S
        return pieces

    def run(X, P, M):
        X = np.asarray(X, dtype=np.int64)
        sums = X.sum(axis=1).astype(np.float64)
        sw = sums / sums.max()
        sim_p = pieces_nb(X, P, sw)
        sim_d = jsq_nb(X, sim_p, M, sw)
        pieces = kernel_nb(X.astype(np.float32), P, M, sim_p.astype(np.int32), sw.astype(np.float32))
        dep = jsq_nb(X, pieces, M, sw)
        xall = X.sum(0)
        unit = np.divide(xall, pieces, out=np.zeros_like(xall, dtype=float), where=pieces != 0)
        simu = xall / sim_p
        if unit[dep].sum(-1).max() > simu[sim_d].sum(-1).max():
            return sim_d, sim_p, True
        return dep, pieces, False

    return run


def check_numba(cases):
    run = numba_flashlb()
    bad = 0
    for c in cases:
        dep, pieces, sim = run(c["hotness"], c["slots"], c["devices"])
        if dep.tolist() != c["deployment"] or [int(x) for x in pieces] != c["pieces"] or sim != c["simulated"]:
            bad += 1
            print("numba disagrees:", c["name"])
    print(f"numba {__import__('numba').__version__}: {len(cases) - bad} of {len(cases)} FlashLB cases agree")
    return bad == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/peers")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--only", choices=["deepseek_vec", "flashlb"], default=None)
    ap.add_argument("--check-numba", action="store_true", help="also run FlashLB compiled by numba and fail unless it agrees")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.only in (None, "flashlb"):
        rng = random.Random(args.seed)
        cases = flashlb_cases(rng)
        if args.check_numba and not check_numba(cases):
            raise SystemExit(1)
        with open(os.path.join(args.out, "flashlb.json"), "w") as f:
            json.dump({"source": "scripts/peers_oracle.py: transcription of vllm-ascend policy_flashlb.py@0834773c", "cases": cases}, f)
    if args.only in (None, "deepseek_vec"):
        import torch
        rng = random.Random(args.seed)
        with open(os.path.join(args.out, "deepseek_vec.json"), "w") as f:
            json.dump({"source": "scripts/peers_oracle.py: transcription of sglang deepseek_vec.py@68836b60, torch " + torch.__version__,
                       "cases": vec_cases(torch, rng)}, f)


if __name__ == "__main__":
    main()
