"""Typed facts a tree policy records about one draft tree, beside the tree's common columns.

Torch-free: they travel in traces (tagged by `kind`) and the page replays them without a model.
Each record can add a sentence to a phase of the explain view (`expand_note`, `rerank_note`,
`accept_note`) and, for a lossy policy, say how far it departed from the target (`departure`), so
the figures never need to know which policy made a tree.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from .schema import FieldError, checked, type_name


def _p(x) -> str:
    return "–" if x is None else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


@dataclass
class TreeRecord:
    kind: ClassVar[str] = ""

    def expand_text(self, level: int, new_nodes: int, depths: list[int], best: str) -> str | None:
        """A whole paragraph for expansion level `level`, replacing the generic one (None: keep it)."""
        return None

    def expand_note(self, level: int) -> str:
        return ""

    def rerank_note(self) -> str:
        return ""

    def accept_note(self) -> str:
        return ""

    def departure(self) -> dict | None:
        """Lossy acceptance only: {"rule", "relaxed_tokens", "max_shift"}; None when exact."""
        return None

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}


@dataclass
class DDDRecord(TreeRecord):
    """DDD's depth checks (docs/algorithms.md §5): the beam's log mass at each check level."""
    kind: ClassVar[str] = "depth-checks"
    threshold: float = -0.3
    check_levels: list[int] = field(default_factory=list)
    max_depth: int = 0
    checks: list[dict] = field(default_factory=list)     # {"level", "beam_mass", "stop"} per check reached
    stopped_at: int | None = None

    def expand_note(self, level: int) -> str:
        for c in self.checks:
            if c.get("level") == level + 1:
                return (f" DDD checks the beam here: its log mass {c['beam_mass']:.2f} is "
                        f"{'below' if c['stop'] else 'above'} the threshold {self.threshold}, so it "
                        f"{'stops expanding' if c['stop'] else 'keeps going'}.")
        return ""


@dataclass
class AutoRecord(TreeRecord):
    """The hardware-aware budget's choice this cycle (docs/algorithms.md §9)."""
    kind: ClassVar[str] = "budget"
    n: int = 1                      # tokens verified, root included
    levels: int = 0                 # draft calls past the root's children
    expected_tokens: float = 1.0    # at the best N
    best_n: int | None = None       # the best N; differs from n when this cycle re-measures another size

    def rerank_note(self) -> str:
        best = self.n if self.best_n is None else self.best_n
        text = (f" **Hardware-aware budget:** instead of a fixed N, this cycle's N = {best} maximises "
                f"expected tokens per second, (1 + the sum of the kept values) / (draft time + the target's "
                f"measured time to verify N tokens); it expects {self.expected_tokens:.2f} tokens. It drafted "
                f"{self.levels} level(s) past the root's children, each only after predicting that it would "
                f"raise that rate.")
        if best != self.n:
            text += (f" This cycle verifies N = {self.n} instead, to re-measure what that size costs on this "
                     f"machine (the budget's cost table corrects itself from every verification).")
        return text


@dataclass
class DySpecRecord(TreeRecord):
    """How DySpec grew this tree (docs/algorithms.md §6)."""
    kind: ClassVar[str] = "heap-growth"
    mode: str = "heap"
    greedy: bool = True
    temperature: float = 0.0
    budget: int = 0
    threshold: float | None = None
    best_first: bool = False
    slot_value: list[float | None] = field(default_factory=list)   # log value of the slot each node came from
    ranks: str = "draft probability"
    nonfinite_draft_nodes: list[int] = field(default_factory=list)

    def expand_text(self, level, new_nodes, depths, best) -> str:
        return (f"**Draft call {level + 1}.** DySpec grows the tree greedily: it keeps a heap of expandable "
                f"slots keyed by their estimated value, takes the best one, draws a token there from the "
                f"draft's remaining distribution and pushes the sibling and child slots. This call added "
                f"{new_nodes} node{'s' if new_nodes != 1 else ''} at depth "
                f"{', '.join(map(str, depths)) or '–'}.{best} Because each token is drawn before it is "
                f"known, the sampled tree can still be verified exactly.")


@dataclass
class RelaxationRecord(TreeRecord):
    """LANTERN / LANTERN++ relaxed acceptance (LOSSY; docs/algorithms.md §8): its rule and,
    per visited position, which neighbours' mass moved onto which token."""
    kind: ClassVar[str] = "relaxation"
    rule: str = "lantern++"
    lam: float | None = None
    delta: float | None = None
    k: int = 10
    metric: str = "cosine"
    lossy: bool = True
    positions: list[dict] = field(default_factory=list)
    relaxed_tokens: int = 0
    tv_max: float = 0.0

    def accept_note(self) -> str:
        return (f" **Lossy:** {self.rule} acceptance also lets through tokens whose embedding neighbours hold "
                f"target mass; here {self.relaxed_tokens} accepted token(s) needed the relaxation (largest "
                f"distribution shift {_p(self.tv_max)}). The output is no longer exactly the target's.")

    def departure(self) -> dict:
        return {"rule": self.rule, "relaxed_tokens": self.relaxed_tokens, "max_shift": self.tv_max}


KINDS: dict[str, type[TreeRecord]] = {c.kind: c for c in (DDDRecord, AutoRecord, DySpecRecord, RelaxationRecord)}


def record_from_dict(d: dict | None, where: str = "record") -> TreeRecord | None:
    """The record a trace stored (its `kind` names the class), each field checked against its type
    (a FieldError, a UserError, names the first that is not)."""
    if d is None or d == {}:
        return None
    if not isinstance(d, dict):
        raise FieldError(f"{where}: expected dict or None, got {type_name(d)}")
    d = dict(d)
    kind = d.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FieldError(f"{where}.kind: unknown tree record kind {kind!r} (known: {', '.join(KINDS)})")
    return cls(**checked(cls, d, where))
