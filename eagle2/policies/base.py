"""The interface every tree policy implements (docs/algorithms.md §10).

A policy proposes; the decoder verifies. Like Hugging Face's CandidateGenerator, the policy owns
what it proposes (`draft`: a tree under the root, cycle/tree_arrays.TreeArrays) and may own how the target's verdict is
read (`accept`: the default is the lossless rule; a lossy policy such as LANTERN++ overrides it
and says so through `lossy` / `lossy_note`). `prepare` does per-model work outside the timed
steps, `summary_stats` reports what the policy decided over a run. Policies are dataclasses whose
fields are their parameters; `from_options` builds one from the common tree flags plus its own
`options`, and `validate` rejects bad values with a UserError before any model work.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..cycle import verify as V
from ..cycle.drafting import HeadRunner
from ..cycle.layout import VerifyBatch
from ..cycle.sampling import SamplingParams
from ..cycle.tree_arrays import TreeArrays
from ..errors import UserError, check

TREE_PARAMS = ("total_tokens", "depth", "top_k")  # the common flags (--total-tokens, --depth, --top-k)


@dataclass(frozen=True)
class Option:
    """One of a policy's own parameters, exposed as a command-line flag (generate, bench)."""
    flag: str           # e.g. "--ddd-threshold"
    field: str          # the dataclass field it sets
    type: type
    help: str


class TreePolicy:
    name: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    tree_params: ClassVar[tuple[str, ...]] = TREE_PARAMS   # which common flags apply
    total_tokens: int                                      # most tokens verified per cycle (sizes caches)
    # prices its trees with this machine's t(N): a tool measures it first, in the foreground
    uses_costs: ClassVar[bool] = False
    # the TreeRecord subclass its trees carry (None: the common columns say it all); traces hold it
    record_type: ClassVar[type | None] = None

    # -- construction
    @classmethod
    def from_options(cls, **kw) -> "TreePolicy":
        """Build from the common tree flags (None = the policy's default; flags that do not apply are
        ignored) and the policy's own parameters (an unknown one is a UserError)."""
        own = {k: v for k, v in kw.items() if k not in TREE_PARAMS}
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(own) - fields)
        if unknown:
            raise UserError(f"Policy {cls.name!r} has no parameter(s) {', '.join(unknown)}.")
        args = {k: v for k, v in kw.items() if v is not None and (k in own or k in cls.tree_params)}
        return cls(**args)

    def validate(self) -> None:
        """Raise UserError on parameters out of range."""

    def prepare(self, bundle) -> None:
        """Per-model set-up outside the timed steps (the prior t(N), a neighbour index)."""

    def fork(self) -> "TreePolicy":
        """A copy that starts from what this policy has learnt (running statistics, measured costs)
        and keeps its own from then on: a preview drafts with it and teaches the original nothing.
        Tensors (neighbour indexes, tables) are shared, read-only."""
        memo = {id(v): v for v in vars(self).values() if isinstance(v, torch.Tensor)}
        return copy.deepcopy(self, memo)

    def params(self) -> dict:
        """What the trace's meta records about this policy."""
        return {k: getattr(self, k) for k in TREE_PARAMS if hasattr(self, k)}

    # -- one cycle
    def draft(self, runner: HeadRunner, root: int) -> TreeArrays:
        raise NotImplementedError

    def native_tree(self, runner: HeadRunner) -> bool:
        """Whether this cycle's tree is the kernels' one call (eagle2.Eagle2Policy.draft_native):
        then a greedy cycle runs whole in the kernels (Decoder.speculate_in_kernels)."""
        return False

    def accept(self, tree: TreeArrays, vb: VerifyBatch, logits: torch.Tensor, sp: SamplingParams,
               gen: torch.Generator, best: list[int] | None = None) -> tuple[list[int], int]:
        """The lossless rule (docs/algorithms.md §7): greedy (on `best`, each row's argmax, when the
        forward gave it), SpecInfer's rule for sampled siblings, or the top-k rule for
        deterministic ones. Returns (accepted verify positions, bonus)."""
        toks = vb.token_list
        if sp.greedy:
            return V.greedy(toks, vb.parent_pos, best if best is not None else logits.argmax(-1).tolist())
        if tree.sampled_drafts:
            return V.specinfer(toks, vb.children, logits, [tree.draft_dists.get(p) for p in vb.pool_idx], sp, gen)
        return V.topk_sampling(toks, vb.children, logits, sp, gen)

    def observe(self, n_verified: int, verify_s: float) -> None:
        """The decoder's timing of this cycle's verification (N tokens, root included): policies
        that budget by measured costs learn from it."""

    def observe_acceptance(self, tree: TreeArrays, vb: VerifyBatch, path_pos: list[int]) -> None:
        """This cycle's verification: the tree, its verified nodes (vb) and the verify positions the
        target accepted; policies that trust the draft's values learn from it."""

    # -- reporting
    @property
    def lossy(self) -> bool:
        return False

    def lossy_note(self, greedy: bool) -> str | None:
        """A line for the user before any output, where the policy can depart from the target."""
        return None

    def summary_stats(self) -> dict:
        return {}


def check_int(owner: str, key: str, v, lo: int, hi: int) -> None:
    check(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
          f"{owner}{key.replace('_', ' ')} must be an integer in [{lo}, {hi}] (got {v!r}).")
