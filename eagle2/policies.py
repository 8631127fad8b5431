"""Tree policies: how the draft tree of a cycle is built (algorithms.md sections 3-4).

Each policy has `draft(runner, root_token) -> DraftTree` and `validate()`. `sampled_drafts`
tells verification which rule keeps it lossless (deterministic top-k drafts vs sampled drafts).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .drafting import HeadRunner
from .errors import UserError, check
from .tree import DraftTree

# EAGLE-1's default shape (algorithms.md section 3): 25 nodes as rank paths.
EAGLE1_SHAPE = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


class _Builder:
    """Accumulates pool nodes; index 0 is the root."""

    def __init__(self, root: int):
        self.t = DraftTree(tokens=[root], parents=[-1], depths=[0], ranks=[0], logp=[0.0],
                           values=[0.0], levels=[-1], kept=[True], order=[0])

    def add(self, tokens, parents, depths, ranks, logp, values, level, kept=False) -> list[int]:
        t = self.t
        n0 = len(t.tokens)
        t.tokens += tokens
        t.parents += parents
        t.depths += depths
        t.ranks += ranks
        t.logp += logp
        t.values += values
        t.levels += [level] * len(tokens)
        t.kept += [kept] * len(tokens)
        t.order += list(range(n0, n0 + len(tokens)))
        return list(range(n0, n0 + len(tokens)))


@dataclass
class StaticPolicy:
    """EAGLE-1: a fixed tree of rank paths; D runs level by level on the non-leaf nodes."""
    shape: list = field(default_factory=lambda: [list(p) for p in EAGLE1_SHAPE])
    name: str = "static"
    sampled_drafts = False

    def validate(self) -> None:
        check(len(self.shape) >= 1, "The static tree needs at least one node.")
        paths = {tuple(p) for p in self.shape}
        for p in self.shape:
            check(len(p) >= 1 and all(isinstance(r, int) and r >= 0 for r in p),
                  f"Static tree path {p} must be a non-empty list of ranks >= 0.")
            check(len(p) == 1 or tuple(p[:-1]) in paths, f"Static tree path {p} has no parent path {p[:-1]}.")

    @property
    def total_tokens(self) -> int:
        return len(self.shape) + 1

    def draft(self, runner: HeadRunner, root: int) -> DraftTree:
        b = _Builder(root)
        by_depth: dict[int, list[tuple]] = {}
        for p in sorted({tuple(p) for p in self.shape}, key=lambda p: (len(p), p)):
            by_depth.setdefault(len(p), []).append(p)
        node_of = {(): 0}
        g_of = {(): runner.root_g}
        slot_of = {(): -1}
        logp_of = {(): runner.root_logp}
        value_of = {(): 0.0}
        for d in sorted(by_depth):
            paths = by_depth[d]
            # children of each parent path at this depth, by rank
            need = {}
            for p in paths:
                need[p[:-1]] = max(need.get(p[:-1], 0), p[-1] + 1)
            topv, topi = {}, {}
            for par, n in need.items():
                v, i = runner.topk(logp_of[par], n)
                topv[par], topi[par] = v.tolist(), i.tolist()
            new = []
            for p in paths:
                par, r = p[:-1], p[-1]
                if r >= len(topv[par]):
                    continue
                lp = topv[par][r]
                value_of[p] = value_of[par] + lp
                (idx,) = b.add([topi[par][r]], [node_of[par]], [d], [r], [lp], [value_of[p]],
                               level=d - 1, kept=True)
                node_of[p] = idx
                new.append(p)
            # run D on the nodes of this depth that have children in the shape
            parents = [p for p in new if any(q[:-1] == p for q in by_depth.get(d + 1, []))]
            if parents:
                g, lp, slots = runner.run([b.t.tokens[node_of[p]] for p in parents],
                                          torch.stack([g_of[p[:-1]] for p in parents]),
                                          [slot_of[p[:-1]] for p in parents], [d] * len(parents))
                for j, p in enumerate(parents):
                    g_of[p], logp_of[p], slot_of[p] = g[j], lp[j], slots[j]
        b.t.extra["draft_calls"] = runner.calls
        return b.t


@dataclass
class Eagle2Policy:
    """EAGLE-2: expand the top_k highest-value nodes per level for `depth` levels, then keep the
    total_tokens - 1 highest-value nodes of the whole pool (algorithms.md section 4)."""
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    name: str = "eagle2"
    sampled_drafts = False

    def validate(self) -> None:
        for key, lo, hi in (("total_tokens", 1, 1024), ("depth", 1, 32), ("top_k", 1, 64)):
            v = getattr(self, key)
            check(isinstance(v, int) and lo <= v <= hi,
                  f"{key.replace('_', ' ')} must be an integer in [{lo}, {hi}] (got {v!r}).")

    def stop_early(self, level: int, beam_values: torch.Tensor, info: dict, tree: DraftTree) -> bool:
        return False  # EAGLE-2 always expands to full depth (DDD and the auto budget override this)

    def draft(self, runner: HeadRunner, root: int) -> DraftTree:
        k = self.top_k
        b = _Builder(root)
        v, ids = runner.topk(runner.root_logp, k)
        kk = v.numel()
        beam = b.add(ids.tolist(), [0] * kk, [1] * kk, list(range(kk)), v.tolist(), v.tolist(), level=0)
        beam_vals = v
        beam_g = runner.root_g.expand(kk, -1)
        beam_parent_slots = [-1] * kk
        info: dict = {"beam": [beam], "beam_mass": [float(torch.logsumexp(beam_vals, 0))]}
        for level in range(1, self.depth + 1):
            if self.stop_early(level, beam_vals, info, b.t):
                break
            g, lp, slots = runner.run([b.t.tokens[i] for i in beam], beam_g, beam_parent_slots,
                                      [b.t.depths[i] for i in beam])
            cv, cid = runner.topk(lp, k)                       # [beam, k]
            cand_vals = beam_vals[:, None] + cv                # path values of all children
            nb, kc = cand_vals.shape
            idx = b.add(cid.flatten().tolist(), [beam[r] for r in range(nb) for _ in range(kc)],
                        [b.t.depths[beam[0]] + 1] * (nb * kc), list(range(kc)) * nb,
                        cv.flatten().tolist(), cand_vals.flatten().tolist(), level=level)
            if level == self.depth:
                break
            sel = cand_vals.flatten().topk(min(k, nb * kc)).indices  # global top-k across the level
            rows = sel // kc
            beam = [idx[j] for j in sel.tolist()]
            beam_vals = cand_vals.flatten()[sel]
            beam_g = g[rows]
            beam_parent_slots = [slots[r] for r in rows.tolist()]
            info["beam"].append(beam)
            info["beam_mass"].append(float(torch.logsumexp(beam_vals, 0)))
        self.rerank(b.t)
        b.t.extra.update(info, draft_calls=runner.calls)
        return b.t

    def rerank(self, t: DraftTree) -> None:
        """Keep the total_tokens-1 best non-root nodes by value (ties: shallower, then earlier),
        then close the set under parents."""
        n = len(t.tokens) - 1
        keep = min(self.total_tokens - 1, n)
        if keep > 0:
            vals = np.asarray(t.values[1:])
            depths = np.asarray(t.depths[1:])
            order = np.lexsort((np.arange(n), depths, -vals))[:keep]
            for j in order:
                t.kept[j + 1] = True
        t.close_under_parents()


def make_policy(name: str, total_tokens=None, depth=None, top_k=None, shape=None, profile=None, **own):
    """`own`: a registered policy's own parameters (extra_policies.REGISTRY factories).
    'eagle2-auto' (the hardware-aware budget; total_tokens and depth are its caps) needs
    `profile`, the target's measured verification times (Decoder measures them), and takes
    `adaptive_depth` (default True; False keeps the depth fixed and chooses only N)."""
    name = (name or "eagle2").lower()
    extra = set(own) - ({"adaptive_depth"} if name == "eagle2-auto" else set())
    if extra and name in ("static", "eagle2", "eagle2-auto"):
        raise UserError(f"Policy {name!r} has no parameter(s) {', '.join(sorted(extra))}.")
    tree_kw = {k: v for k, v in dict(total_tokens=total_tokens, depth=depth, top_k=top_k).items() if v is not None}
    if name == "static":
        p = StaticPolicy(shape=[list(s) for s in shape]) if shape else StaticPolicy()
    elif name == "eagle2":
        p = Eagle2Policy(**tree_kw)
    elif name == "eagle2-auto":
        from .budget import AutoBudgetPolicy
        Eagle2Policy(**tree_kw).validate()  # the caps obey EAGLE-2's ranges
        if "total_tokens" in tree_kw:
            tree_kw["max_tokens"] = tree_kw.pop("total_tokens")
        if profile:  # no extrapolation past the largest measured N
            tree_kw["max_tokens"] = min(tree_kw.get("max_tokens", 64), max(int(n) for n in profile))
        p = AutoBudgetPolicy(profile=profile or {}, **tree_kw, **own)
    else:
        from . import extra_policies
        if name not in extra_policies.REGISTRY:
            raise UserError(f"Unknown policy {name!r}: choose plain, static, eagle2, eagle2-auto"
                            + "".join(f", {n}" for n in extra_policies.REGISTRY) + ".")
        try:
            p = extra_policies.REGISTRY[name](total_tokens=total_tokens, depth=depth, top_k=top_k, **own)
        except TypeError as e:  # an unknown keyword for this policy
            raise UserError(f"Policy {name!r}: {e}.") from None
    p.validate()
    return p
