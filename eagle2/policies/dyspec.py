"""DySpec greedy dynamic tree with sampled drafts (docs/algorithms.md §6).

A max-heap of expandable slots keyed by estimated value. A slot is a tree node n together with
the residual of its draft distribution R_n (the head's distribution after n with the children
already drawn at n removed and renormalised); its value is v_n * (mass of R_n not yet drawn), the
probability mass its next draw covers. Start with the root's slot (value 1). Until the tree holds
the budget (total_tokens - 1 nodes under the root): pop the best slot, draw y from its residual,
add y under n, then push n's sibling slot (value v_n * (1 - q(y1) - ... - q(y))) and y's own slot
(value v_y = v_n * q(y), with R_y = D(. | path to y)). A node's value is the product of the
original draft probabilities along its path.

Sampling (temperature > 0): y ~ R, and the draft distribution is the head's distribution at the
same temperature. Each parent's q (a dense [V_target] tensor; zero outside the head's draft
vocabulary) is kept in `tree.draft_dists` and verification uses the SpecInfer rule for siblings
sampled without replacement (verify.specinfer), so the output distribution is exactly the
target's. Greedy (temperature 0): y = the most likely token left in R, i.e. siblings are the
head's top tokens in order (drafts need not be random when the target's choice is deterministic),
with the paper's heap keys. Verification is greedy, hence token-for-token plain greedy.
Option `best_first` (greedy only): the value of the child a slot would add is then known,
v_n * max R_n, and the heap is keyed by it instead of by v_n * remaining mass (which only bounds
it), so the tree is exactly the budget's highest-value nodes, the optimum of the
expected-accepted-length model (tokens per cycle ~ 1 + sum of node values). The price: a node's
key is only known once the head has run there, so nearly every node costs a draft call (with a
flat head, ~budget calls per cycle instead of 1), which is why it is not the default.

The threshold variant (`threshold` = t) builds level by level instead: at every level each node
keeps drawing children while its slot value exceeds t, children with value > t are expanded at the
next level (one batched draft call per level), until the budget is spent.

The head is run lazily: a node's distribution is computed when its slot is first popped (with up
to `lookahead` - 1 other not-yet-run nodes of the highest value in the same batched call).

Recorded per tree: `tree.order` (= pool order: the order nodes were added), `ranks` = sampling
order among siblings, `levels` = the draft call whose distribution proposed the node, and a
DySpecRecord: mode, greedy, temperature, budget, threshold and `slot_value` (log value of the
slot each node was drawn from, in pool order; None for the root).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from ..cycle.drafting import HeadRunner
from ..cycle.tree import TreeRecord
from ..cycle.tree_arrays import TreeArrays
from ..cycle.tree_builder import TreeBuilder
from ..errors import check
from .base import Option, TreePolicy, check_int


def _draw(r: torch.Tensor, gen: torch.Generator) -> int:
    if r.device != gen.device:
        r = r.to(gen.device)
    return int(torch.multinomial(r, 1, generator=gen).item())


@dataclass
class DySpecRecord(TreeRecord):
    """How DySpec grew this tree."""
    kind: Literal["heap-growth"] = "heap-growth"
    mode: str = "heap"
    greedy: bool = True
    temperature: float = 0.0
    budget: int = 0
    threshold: float | None = None
    best_first: bool = False
    slot_value: list[float | None] = field(default_factory=list)   # log value of the slot each node came from
    ranks: str = "draft probability"
    nonfinite_draft_nodes: list[int] = field(default_factory=list)


@dataclass
class DySpecPolicy(TreePolicy):
    total_tokens: int = 60              # budget: tokens the target verifies per cycle, root included
    depth: int = 12                     # max depth of a drafted node (bounds the draft calls)
    top_k: int | None = None            # max children per node (None: no cap)
    threshold: float | None = None      # t: the level-by-level threshold variant (None: heap)
    lookahead: int = 1                  # nodes the head runs per draft call in the heap mode
    best_first: bool = False            # greedy only: exact keys, the top-N tree (see module doc)
    name: ClassVar[str] = "dyspec"
    record_type: ClassVar[type] = DySpecRecord
    options: ClassVar[tuple] = (
        Option("--dyspec-threshold", "threshold", float,
               "DySpec: use the threshold variant with this t (about 1/budget) instead of the max-heap"),
        Option("--dyspec-lookahead", "lookahead", int,
               "DySpec: nodes the draft head runs per call in the heap variant (default 1)"),
    )

    def validate(self) -> None:
        for key, lo, hi in (("total_tokens", 2, 1024), ("depth", 1, 64), ("lookahead", 1, 64)):
            check_int("DySpec ", key, getattr(self, key), lo, hi)
        k = self.top_k
        check(k is None or (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 1024),
              f"DySpec top k (max children per node) must be an integer in [1, 1024] or unset (got {k!r}).")
        check(isinstance(self.best_first, bool), f"DySpec best_first must be True or False (got {self.best_first!r}).")
        t = self.threshold
        check(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 < t < 1.0),
              f"DySpec threshold must be a probability in (0, 1), about 1/budget (got {t!r}).")

    # ------------------------------------------------------------------------------------------
    def draft(self, runner: HeadRunner, root: int) -> TreeArrays:
        sp = runner.sampling
        greedy = sp.greedy
        temp = 1.0 if greedy else float(sp.temperature)
        st = _State(self, runner, root, greedy, temp, runner.gen)
        if self.threshold is None:
            st.grow_heap()
        else:
            st.grow_threshold()
        t = st.b
        if not greedy:
            t.draft_dists = {n: q for n, q in st.q_full.items() if st.nchild.get(n, 0) > 0}
        t.sampled_drafts = not greedy
        t.draft_calls = runner.calls
        t.record = DySpecRecord(mode="heap" if self.threshold is None else "threshold", greedy=greedy,
                                temperature=0.0 if greedy else temp, budget=self.total_tokens - 1,
                                threshold=self.threshold, best_first=greedy and self.best_first,
                                slot_value=st.slot_value, nonfinite_draft_nodes=st.nonfinite,
                                ranks="sampling order" if not greedy else "draft probability")
        return t.build()


class _State:
    """One tree build: per-node residuals, head features and cache slots."""

    def __init__(self, pol: DySpecPolicy, runner: HeadRunner, root: int, greedy: bool, temp: float, gen):
        self.pol, self.runner, self.greedy, self.temp, self.gen = pol, runner, greedy, temp, gen
        self.b = TreeBuilder(root)
        self.draft_ids = runner.draft.draft_ids
        self.V = runner.draft.vocab_size
        self.Vd = runner.root_logp.shape[-1]
        self.budget = pol.total_tokens - 1
        self.R: dict[int, torch.Tensor] = {}        # residual weights over the draft vocab
        self.q_full: dict[int, torch.Tensor] = {}   # original q over the target vocab (sampling)
        self.rem: dict[int, float] = {}             # mass of R not yet drawn
        self.nchild: dict[int, int] = {}
        self.g_of = {0: runner.root_g}
        self.slot_of = {0: -1}
        self.call_of = {0: 0}
        self.slot_value: list = [None]
        self.counter = 0
        self.nonfinite: list[int] = []
        self._set_dist(0, runner.root_logp)

    def _set_dist(self, n: int, logp: torch.Tensor) -> None:
        lp = logp.float()
        q = torch.softmax(lp / self.temp, -1) if self.temp != 1.0 else lp.exp()
        self.nchild[n] = 0
        if not bool(torch.isfinite(q).all()):
            # a diverging head (features overflowing along a long chain): this node gets no
            # children. The decision uses draft-side numbers only, so losslessness is unaffected.
            self.R[n], self.rem[n] = q.nan_to_num(0.0, 0.0, 0.0), 0.0
            self.nonfinite.append(n)
            return
        self.R[n] = q.clone()
        self.rem[n] = 1.0
        if not self.greedy:
            if self.draft_ids is None:
                qf = q.clone()
            else:
                qf = torch.zeros(self.V, dtype=q.dtype, device=q.device)
                qf[self.draft_ids] = q
            self.q_full[n] = qf

    def _run(self, nodes: list[int]) -> None:
        t = self.b
        r = self.runner
        g, lp, slots = r.run([t.tokens[m] for m in nodes], torch.stack([self.g_of[t.parents[m]] for m in nodes]),
                             [self.slot_of[t.parents[m]] for m in nodes], [t.depths[m] for m in nodes])
        call = r.calls - 1
        for j, m in enumerate(nodes):
            self.g_of[m], self.slot_of[m], self.call_of[m] = g[j], slots[j], call
            self._set_dist(m, lp[j])

    def _draw_child(self, n: int, slot_logv: float) -> int | None:
        """Draw one child of n from its residual; returns its pool index, None if R is spent."""
        r = self.R[n]
        if self.nchild[n] >= self.Vd or self.rem[n] <= 0.0:
            return None
        yi = int(r.argmax()) if self.greedy else _draw(r, self.gen)
        qy = float(r[yi])
        if qy <= 0.0:
            return None
        r[yi] = 0.0
        self.rem[n] = float(r.sum(dtype=torch.float64))
        y = yi if self.draft_ids is None else int(self.draft_ids[yi])
        t = self.b
        lq = math.log(qy)
        (idx,) = self.b.add([y], [n], [t.depths[n] + 1], [self.nchild[n]], [lq], [t.values[n] + lq],
                            level=self.call_of[n], kept=True)
        self.nchild[n] += 1
        self.slot_value.append(slot_logv)
        return idx

    def _take(self, heap, n: int, slot_logv: float, floor: float | None = None) -> int | None:
        """Draw a child at n's slot, popped with log value slot_logv, and push the slot back for
        n's next sibling (the threshold variant: only if its key is above `floor`). Returns the
        child's pool index, None if the slot is spent."""
        idx = self._draw_child(n, slot_logv)
        if idx is not None and self._sibling_ok(n):
            v = self._key(n)
            if floor is None or v > floor:
                self._push(heap, v, n)
        return idx

    def _sibling_ok(self, n: int) -> bool:
        k = self.pol.top_k
        return self.rem[n] > 0.0 and self.nchild[n] < self.Vd and (k is None or self.nchild[n] < k)

    def _key(self, n: int) -> float:
        """Log heap key of n's slot (n's distribution known): the paper's v_n * (mass not yet
        drawn); with best_first (greedy), the exact value of the child it would add, v_n * max R_n."""
        if self.greedy and self.pol.best_first:
            m = float(self.R[n].max())
            return self.b.values[n] + math.log(m) if m > 0.0 else -math.inf
        return self.b.values[n] + math.log(self.rem[n])

    def _push(self, heap, logv: float, n: int) -> None:
        self.counter += 1
        heapq.heappush(heap, (-logv, self.counter, n))

    def grow_heap(self) -> None:
        """Slots of nodes whose distribution is not computed yet are keyed by the node's own value
        (the paper's key; with best_first an upper bound, replaced by the exact key once the head
        has run there, so nodes are added exactly in decreasing value)."""
        t = self.b
        heap: list = []
        self._push(heap, self._key(0), 0)
        added = 0
        look = self.pol.lookahead
        while heap and added < self.budget:
            negv, _, n = heapq.heappop(heap)
            if n not in self.R:
                batch = [n]
                if look > 1:
                    for _, _, m in heapq.nsmallest(4 * look, heap):
                        if m not in self.R and m not in batch:
                            batch.append(m)
                            if len(batch) >= look:
                                break
                self._run(batch)
                if self.greedy and self.pol.best_first:  # the key was an upper bound: requeue
                    if self._sibling_ok(n):
                        self._push(heap, self._key(n), n)
                    continue
            idx = self._take(heap, n, -negv)
            if idx is None:
                continue
            added += 1
            if t.depths[idx] < self.pol.depth:
                self._push(heap, t.values[idx], idx)

    def grow_threshold(self) -> None:
        t = self.b
        logt = math.log(self.pol.threshold)
        frontier = [0]
        added = 0
        while frontier and added < self.budget:
            heap: list = []
            for n in frontier:
                if self._sibling_ok(n):
                    self._push(heap, self._key(n), n)
            new = []
            while heap and added < self.budget:
                negv, _, n = heapq.heappop(heap)
                if -negv <= logt:
                    break
                idx = self._take(heap, n, -negv, floor=logt)
                if idx is None:
                    continue
                added += 1
                if t.values[idx] > logt and t.depths[idx] < self.pol.depth:
                    new.append(idx)
            if new and added < self.budget:
                self._run(new)
            frontier = new
