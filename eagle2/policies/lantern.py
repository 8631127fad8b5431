"""LANTERN++ (and LANTERN): a static tree with relaxed acceptance (docs/algorithms.md §8). LOSSY.

Drafting is EAGLE-1's static tree. Verification accepts a draft token x against a relaxed target
distribution in which the mass of some of x's latent neighbours (its k nearest rows of the
target's embedding matrix, L2 or cosine) is moved onto x: LANTERN++ moves at most
(lam - 1) * p(x) (so p~(x) <= lam * p(x)), LANTERN at most delta (total variation <= delta).
The rules, their per-step bounds and the greedy variant are in lantern_rule.py (relax,
relaxed_greedy, relaxed_sampling). lam = 1 (or delta = 0) moves nothing and is exact verification.

Every verified tree records a RelaxationRecord: the rule and its parameters, and per
visited position (pool indices) which neighbours' mass was moved onto which token, how much, the
exact total-variation distance between the target's distribution and the one the token was
drawn from (sampling) or whether the token departs from the exact argmax (greedy), and the bound.

The neighbour index is computed once per model (chunked, the default model's 49152 x 576
embedding takes a few minutes on a small CPU), cached under cache_dir()/lantern and kept in the
bundle's `derived` dict for the process.
"""
from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from ..cycle.drafting import HeadRunner
from ..cycle.layout import VerifyBatch
from ..cycle.sampling import SamplingParams
from ..cycle.tree import TreeRecord
from ..cycle.tree_arrays import TreeArrays
from ..errors import UserError, check
from ..files import atomic_path
from ..model.weights import cache_dir
from .lantern_rule import relaxed_greedy, relaxed_sampling
from .base import Option
from .static import StaticPolicy

log = logging.getLogger(__name__)

METRICS = ("cosine", "l2")
LOSSY_NOTE = ("note: policy 'lantern' is LOSSY: relaxed acceptance lets tokens near the target's choice in "
              "embedding space through, so the output is NOT the target model's exact {mode} output "
              "({bound}). Use --lantern-lambda 1 for exact decoding.")


# ------------------------------------------------------------------------------------ neighbours
def knn_index(E: torch.Tensor, k: int, metric: str = "cosine", chunk: int = 1024, progress: bool = False) -> torch.Tensor:
    """[V, k] int64: for every row of the embedding matrix E [V, D], the indices of its k nearest
    other rows (the row itself excluded), nearest first. cosine: largest cosine similarity;
    l2: smallest Euclidean distance. Computed in chunks of rows (memory chunk x V). Exact ties
    are ordered as torch.topk returns them."""
    check(metric in METRICS, f"LANTERN metric must be one of {', '.join(METRICS)} (got {metric!r}).")
    E = E.detach().float()
    V = E.shape[0]
    check(isinstance(k, int) and 1 <= k < V, f"LANTERN k must be an integer in [1, {V - 1}] (got {k!r}).")
    if metric == "cosine":
        X = F.normalize(E, dim=1)
        sq = None
    else:
        X = E
        sq = (E * E).sum(1)
    out = torch.empty(V, k, dtype=torch.long, device=E.device)
    n_chunks = (V + chunk - 1) // chunk
    for ci, s in enumerate(range(0, V, chunk)):
        e = min(V, s + chunk)
        sc = X[s:e] @ X.T                     # larger = nearer
        if sq is not None:
            sc = 2.0 * sc - sq[None, :]       # -|a-b|^2 + |a|^2 (the row's own |a|^2 is constant)
        sc[torch.arange(e - s, device=E.device), torch.arange(s, e, device=E.device)] = float("-inf")
        out[s:e] = sc.topk(k, dim=1).indices
        if progress and (ci % 8 == 7 or ci == n_chunks - 1):
            log.info(f"LANTERN neighbour index {e}/{V} rows")
    return out


def _cache_stem(name: str, E: torch.Tensor, metric: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:60] or "model"
    h = hashlib.sha1(E.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]
    return f"{slug}-{E.shape[0]}x{E.shape[1]}-{h}-{metric}"


def neighbours_for(bundle, k: int, metric: str = "cosine") -> torch.Tensor:
    """The k-NN index of bundle's target embedding, from memory, the disk cache (a cached larger k
    serves a smaller one) or computed once and cached. Keyed by model name + embedding hash +
    metric + k."""
    from safetensors.torch import load_file, save_file

    mem = bundle.derived
    if ("lantern", k, metric) in mem:
        return mem[("lantern", k, metric)]
    E = bundle.forward.embedding()
    V = E.shape[0]
    check(isinstance(k, int) and 1 <= k < V, f"LANTERN k must be an integer in [1, {V - 1}] for this model (got {k!r}).")
    folder = cache_dir() / "lantern"
    folder.mkdir(parents=True, exist_ok=True)
    stem = mem.get(("lantern-stem", metric)) or _cache_stem(bundle.name, E, metric)
    mem[("lantern-stem", metric)] = stem
    idx = None
    found = []
    for f in folder.glob(stem + "-k*.safetensors"):
        m = re.fullmatch(re.escape(stem) + r"-k(\d+)\.safetensors", f.name)
        if m and int(m.group(1)) >= k:
            found.append((int(m.group(1)), f))
    for kk, f in sorted(found):
        try:
            t = load_file(str(f))["neighbours"]
            if t.shape == (V, kk):
                idx = t[:, :k].long()
                break
        except Exception:
            continue  # a corrupt cache file: recompute
    if idx is None:
        log.info(f"computing the LANTERN neighbour index of {bundle.name} ({V} tokens, k={k}, "
                 f"{metric}; once, cached in {folder})...")
        idx = knn_index(E, k, metric, progress=V > 20000).cpu()
        with atomic_path(folder / f"{stem}-k{k}.safetensors") as tmp:
            save_file({"neighbours": idx.to(torch.int32 if V < 2**31 else torch.int64).contiguous()}, str(tmp))
    idx = idx.to(E.device)
    mem[("lantern", k, metric)] = idx
    return idx


# ------------------------------------------------------------------------------------ policy
@dataclass
class RelaxationRecord(TreeRecord):
    """LANTERN / LANTERN++ relaxed acceptance (LOSSY): its rule and, per visited position, which
    neighbours' mass moved onto which token."""
    kind: Literal["relaxation"] = "relaxation"
    rule: str = "lantern++"
    lam: float | None = None
    delta: float | None = None
    k: int = 10
    metric: str = "cosine"
    lossy: bool = True
    positions: list[dict] = field(default_factory=list)
    relaxed_tokens: int = 0
    tv_max: float = 0.0

    def departure(self) -> dict:
        return {"rule": self.rule, "relaxed_tokens": self.relaxed_tokens, "max_shift": self.tv_max}


@dataclass
class LanternPolicy(StaticPolicy):
    """EAGLE-1 static tree + LANTERN++ (lam) or LANTERN (delta) relaxed acceptance. Lossy."""
    lam: float | None = 5.0             # LANTERN++ multiplicative bound (authors' (k, lam) = (10, 5))
    delta: float | None = None          # LANTERN additive bound (replaces lam when set)
    k: int = 10
    metric: str = "cosine"
    stats: dict = field(default_factory=lambda: {"positions": 0, "relaxed_tokens": 0, "tokens_checked": 0,
                                                 "tv_sum": 0.0, "tv_max": 0.0, "moved_mass_sum": 0.0}, init=False)
    _nbrs: torch.Tensor | None = field(default=None, init=False, repr=False)
    name: ClassVar[str] = "lantern"
    record_type: ClassVar[type] = RelaxationRecord
    options: ClassVar[tuple] = (
        Option("--lantern-lambda", "lam", float, "LANTERN++ multiplicative bound lambda >= 1 (default 5; 1 = exact)"),
        Option("--lantern-delta", "delta", float,
               "LANTERN additive bound delta in [0, 1] instead of lambda (0 = exact)"),
        Option("--lantern-k", "k", int, "LANTERN: latent neighbours per token (default 10)"),
        Option("--lantern-metric", "metric", str, "LANTERN: embedding distance, cosine (default) or l2"),
    )

    @classmethod
    def from_options(cls, **kw) -> "LanternPolicy":
        """total_tokens / depth / top_k do not apply (the tree is EAGLE-1's static shape); delta
        replaces the default lambda."""
        if kw.get("lam") is not None and kw.get("delta") is not None:
            raise UserError("LANTERN takes either --lantern-lambda (LANTERN++) or --lantern-delta (LANTERN), not both.")
        p = super().from_options(**kw)
        if kw.get("delta") is not None:
            p.lam = None
        return p

    def validate(self) -> None:
        super().validate()
        check((self.lam is None) != (self.delta is None),
              "LANTERN takes either lambda (LANTERN++, multiplicative) or delta (LANTERN, additive), "
              "not both.")
        if self.lam is not None:
            check(isinstance(self.lam, (int, float)) and not isinstance(self.lam, bool)
                  and math.isfinite(self.lam) and 1.0 <= self.lam <= 1000.0,
                  f"LANTERN++ lambda must be a number in [1, 1000] (got {self.lam!r}); 1 = exact verification.")
        else:
            check(isinstance(self.delta, (int, float)) and not isinstance(self.delta, bool)
                  and 0.0 <= self.delta <= 1.0,
                  f"LANTERN delta must be a probability in [0, 1] (got {self.delta!r}); 0 = exact verification.")
        check(isinstance(self.k, int) and not isinstance(self.k, bool) and 1 <= self.k <= 1000,
              f"LANTERN k (latent neighbours per token) must be an integer in [1, 1000] (got {self.k!r}).")
        check(self.metric in METRICS, f"LANTERN metric must be one of {', '.join(METRICS)} (got {self.metric!r}).")

    @property
    def rule(self) -> str:
        return "lantern++" if self.delta is None else "lantern"

    def bound_text(self) -> str:
        return (f"LANTERN++: p~(x) <= {self.lam:g} p(x), k={self.k}" if self.delta is None
                else f"LANTERN: total variation <= {self.delta:g} per position, k={self.k}")

    @property
    def exact(self) -> bool:
        """lam = 1 / delta = 0: nothing is ever moved, verification is exact."""
        return self.lam == 1.0 if self.delta is None else self.delta == 0.0

    @property
    def lossy(self) -> bool:
        return not self.exact

    def lossy_note(self, greedy: bool) -> str | None:
        if self.exact:
            return (f"note: policy 'lantern' with {'lambda = 1' if self.delta is None else 'delta = 0'} moves no "
                    f"probability mass: verification is exact (normally LANTERN is LOSSY).")
        return LOSSY_NOTE.format(mode="greedy" if greedy else "sampling", bound=self.bound_text())

    def prepare(self, bundle) -> None:
        """Load (or compute and cache, once per model) the neighbour index before decoding."""
        self._nbrs = neighbours_for(bundle, self.k, self.metric)

    def accept(self, tree: TreeArrays, vb: VerifyBatch, logits: torch.Tensor, sp: SamplingParams,
               gen: torch.Generator, best: list[int] | None = None) -> tuple[list[int], int]:
        """Relaxed acceptance (LOSSY unless exact); records, per visited position, what was moved
        (pool indices and token ids) in the tree's RelaxationRecord and adds it to self.stats."""
        rx = tree.record
        check(self._nbrs is not None, "LANTERN needs its neighbour index: prepare the policy first.")
        toks = vb.tokens.tolist()
        log: list = []
        if sp.greedy:
            path, bonus = relaxed_greedy(toks, vb.children, logits, self._nbrs, self.lam, self.delta, log)
        else:
            path, bonus = relaxed_sampling(toks, vb.children, logits, self._nbrs, self.lam, self.delta, sp, gen, log)
        pool = vb.pool_idx
        recs = []
        for e in log:
            e = dict(e)
            e.pop("dist", None)
            e["parent"] = pool[e["parent"]]
            if e.get("node") is not None:
                e["node"] = pool[e["node"]]
            if e.get("accepted") is not None:
                e["accepted"] = pool[e["accepted"]]
            if "trials" in e:
                e["trials"] = [{**tr, "node": pool[tr["node"]]} for tr in e["trials"]]
            recs.append(e)
        rx.positions = recs
        if sp.greedy:
            rx.relaxed_tokens = sum(1 for e in recs if e["relaxed"])
            rx.tv_max = max((e["moved_mass"] for e in recs), default=0.0)
        else:
            rx.relaxed_tokens = sum(1 for e in recs if e["accepted"] is not None and any(
                tr["node"] == e["accepted"] and tr["moved_mass"] > 0 for tr in e["trials"]))
            rx.tv_max = max((e["tv"] for e in recs), default=0.0)
        s = self.stats
        s["positions"] += len(recs)
        s["tokens_checked"] += len(path)
        s["relaxed_tokens"] += rx.relaxed_tokens
        tvs = [e["moved_mass"] if sp.greedy else e["tv"] for e in recs]
        s["tv_sum"] += sum(tvs)
        s["tv_max"] = max([s["tv_max"], *tvs])
        s["moved_mass_sum"] += sum(e["moved_mass"] if sp.greedy else sum(tr["moved_mass"] * tr["reach"]
                                                                          for tr in e["trials"]) for e in recs)
        return path, bonus

    def draft(self, runner: HeadRunner, root: int) -> TreeArrays:
        t = super().draft(runner, root)
        t.record = RelaxationRecord(rule=self.rule, lam=self.lam, delta=self.delta, k=self.k, metric=self.metric,
                                    lossy=self.lossy)
        return t

    def summary_stats(self) -> dict:
        s = self.stats
        return {"lossy": self.lossy, "rule": self.rule, "lambda": self.lam, "delta": self.delta, "k": self.k,
                "positions": s["positions"], "relaxed_tokens": s["relaxed_tokens"],
                "relaxed_rate": s["relaxed_tokens"] / max(1, s["tokens_checked"]),
                "mean_tv": s["tv_sum"] / max(1, s["positions"]), "max_tv": s["tv_max"],
                "mean_moved_mass": s["moved_mass_sum"] / max(1, s["positions"])}
