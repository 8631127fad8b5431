"""LANTERN / LANTERN++ relaxed acceptance (docs/algorithms.md §8), LOSSY by design: a draft token
is accepted against a relaxed target distribution in which the mass of some of its latent
neighbours is moved onto it. Same conventions as cycle/verify.py's exact rules: the walk starts at
the root, `children[i]` lists verify positions of node i's children in rank order, `logits[i]` is
the target's output at node i. lam = 1 / delta = 0 moves nothing and is the exact rule.
"""
from __future__ import annotations

import torch

from ..cycle.sampling import SamplingParams, probs_from_logits, sample


def relax(p: torch.Tensor, x: int, nbrs: torch.Tensor, bound: float) -> tuple[list[int], float]:
    """LANTERN's relaxation of distribution p for draft token x: `nbrs` are x's k nearest
    neighbours in the target's embedding space (nearest first, x itself excluded); c_j is the
    mass p puts on the first j of them; take the largest j with c_j <= bound. Returns (the moved
    neighbours, c_j); the relaxed distribution moves that mass onto x:
    p~(x) = p(x) + c_j, p~(n) = 0 for the moved n, TV(p, p~) = c_j."""
    if not bound > 0.0:
        return [], 0.0
    cum = p[nbrs].double().cumsum(0)
    j = int((cum <= bound).sum())
    if j == 0 or float(cum[j - 1]) <= 0.0:
        return [], 0.0
    return nbrs[:j].tolist(), float(cum[j - 1])


def relaxed_greedy(tokens: list[int], children: list[list[int]], logits: torch.Tensor, nbrs: torch.Tensor,
                   lam: float | None, delta: float | None, log: list | None = None) -> tuple[list[int], int]:
    """Greedy relaxed acceptance. With p = softmax(logits) (temperature 1) at the parent and the
    relaxed distribution p~_x of section 8 for child x (bound (lam-1)*p(x), or delta), x is
    accepted iff greedy decoding of p~_x picks x: x is the target's argmax, or
    p(x) + c_j > max{p(y): y not x, not moved}. Among acceptable children the walk takes the one
    with the longest acceptable path below it (ties: the exact argmax child, then rank order),
    as EAGLE's longest-accepted-prefix search does; the bonus is the target's own argmax.
    Stated per-step bound: an accepted token x satisfies p(x) >= p_max / lam (LANTERN++), or
    p(x) >= p_max - delta (LANTERN). With lam = 1 / delta = 0 nothing moves and only the exact
    argmax is acceptable, so this is verify.greedy exactly.
    `log` receives one dict per accepted node (verify positions)."""
    probs = torch.softmax(logits.float(), dim=-1)
    best = logits.argmax(-1).tolist()
    T = len(tokens)
    kk = nbrs.shape[1] + 2
    length = [0] * T
    choice: list[int | None] = [None] * T
    info: dict[int, dict] = {}
    for i in range(T - 1, -1, -1):  # children come after parents in verify order
        if not children[i]:
            continue
        p = probs[i]
        top_v, top_i = p.topk(min(kk, p.numel()))
        top = list(zip(top_i.tolist(), top_v.tolist()))
        cands = []
        for c in children[i]:
            x = tokens[c]
            if x == best[i]:
                cands.append((c, True))
                info[c] = {"moved": [], "moved_mass": 0.0}
                continue
            px = float(p[x])
            bound = delta if delta is not None else (lam - 1.0) * px
            moved, cm = relax(p, x, nbrs[x], bound)
            excl = set(moved) | {x}
            rival = next((v for t, v in top if t not in excl), 0.0)
            if cm > 0.0 and px + cm > rival:
                cands.append((c, False))
                info[c] = {"moved": moved, "moved_mass": cm}
        if cands:
            c, _ = max(cands, key=lambda ce: (length[ce[0]], ce[1], -children[i].index(ce[0])))
            choice[i] = c
            length[i] = 1 + length[c]
    node, path = 0, []
    while choice[node] is not None:
        c = choice[node]
        x = tokens[c]
        if log is not None:
            p = probs[node]
            log.append({"parent": node, "node": c, "token": x, "exact": best[node], "relaxed": x != best[node],
                        "p": float(p[x]), "p_max": float(p[best[node]]), **info[c]})
        path.append(c)
        node = c
    return path, best[node]


def relaxed_sampling(tokens: list[int], children: list[list[int]], logits: torch.Tensor, nbrs: torch.Tensor,
                     lam: float | None, delta: float | None, sp: SamplingParams, gen: torch.Generator | None,
                     log: list | None = None) -> tuple[list[int], int]:
    """verify.topk_sampling with LANTERN's relaxed acceptance. At a node with (residual) target p, each
    child x in rank order is tried against the relaxed p~: the moved neighbours' mass goes to x,
    x is accepted with probability p~(x); on rejection p <- p~ without x, renormalised (so the
    moved neighbours stay at 0). Bounds, per position (the distribution o this rule draws the
    token at that position from, computed exactly and logged):
      LANTERN++ (lam): bound_j = (lam - 1) * p_j(x_j), so o(y) <= lam * p(y) for every y and
        TV(p, o) <= (lam - 1) * sum of the tried children's target mass;
      LANTERN (delta): the siblings share one budget, bound_j = (delta - spent) / R_j (R_j = the
        probability of reaching trial j), so TV(p, o) <= delta.
    With nothing moved the tensor operations and random draws are exactly verify.topk_sampling's,
    so lam = 1 / delta = 0 reproduces exact verification draw for draw."""
    node, path = 0, []
    while True:
        p = probs_from_logits(logits[node], sp)
        p0 = p.clone() if log is not None else None  # p is zeroed in place below, as in verify.topk_sampling
        chain = []
        R, spent, tv_bound = 1.0, 0.0, 0.0
        for c in children[node]:
            x = tokens[c]
            px_before = float(p[x])
            if delta is not None:
                bound = (delta - spent) / R if R > 0.0 else 0.0
            else:
                bound = (lam - 1.0) * px_before
            moved, cm = relax(p, x, nbrs[x], bound)
            if cm > 0.0:
                p = p.clone()
                p[moved] = 0.0
                p[x] += cm
            px = float(p[x])
            chain.append({"node": c, "token": x, "p": px_before, "p_relaxed": px, "moved": moved,
                          "moved_mass": cm, "reach": R})
            spent += R * cm
            tv_bound += R * (lam - 1.0) * px_before if delta is None else 0.0
            if px > 0.0:
                if px >= 1.0:
                    break  # always accepted: later children are unreachable
                p[x] = 0.0
                s = p.sum()
                if not float(s) > 0.0:  # nothing left besides x (float round-off): x is certain
                    chain[-1]["p_relaxed"] = 1.0
                    break
                p = p / s
                R *= (1.0 - px)
        nxt = None
        for st in chain:
            if st["p_relaxed"] > 0.0 and float(torch.rand((), generator=gen)) < st["p_relaxed"]:
                nxt = st["node"]
                break
        if log is not None:
            out = torch.zeros_like(p0, dtype=torch.float64)
            Rr = 1.0
            for st in chain:
                a = st["p_relaxed"]
                out[st["token"]] += Rr * a
                Rr *= (1.0 - a) if a > 0.0 else 1.0
            if Rr > 0.0 and (not chain or chain[-1]["p_relaxed"] < 1.0):
                out += Rr * p.double()
            ref = p0.double()
            pos = ref > 0
            ratio = float((out[pos] / ref[pos]).max()) if bool(pos.any()) else 1.0
            ratio = 1.0 if all(st["moved_mass"] == 0.0 for st in chain) else ratio
            exact = all(st["moved_mass"] == 0.0 for st in chain)  # then o == p up to round-off
            log.append({"parent": node, "accepted": nxt, "trials": chain, "dist": ref if exact else out,
                        "tv": 0.0 if exact else 0.5 * float((out - ref).abs().sum()),
                        "tv_bound": delta if delta is not None else min(1.0, tv_bound),
                        "max_ratio": ratio, "mass_outside_support": float(out[~pos].sum())})
        if nxt is None:
            return path, sample(p, gen)
        path.append(nxt)
        node = nxt
