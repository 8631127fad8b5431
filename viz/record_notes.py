"""What the explain view says about a policy's own tree record (eagle2's TreeRecord subclasses,
told apart by their `kind`): a paragraph that replaces the generic one of an expansion level, or a
sentence added to an expansion level, the rerank or the acceptance. A record of a kind this module
does not know adds nothing, so the figures never need to know which policy made a tree."""
from __future__ import annotations

from .common import fmt_p


def expand_text(rec, level: int, new_nodes: int, depths: list[int], best: str) -> str | None:
    """A whole paragraph for expansion level `level` (None: keep the generic one)."""
    if _kind(rec) == "heap-growth":
        return (f"**Draft call {level + 1}.** DySpec grows the tree greedily: it keeps a heap of expandable "
                f"slots keyed by their estimated value, takes the best one, draws a token there from the "
                f"draft's remaining distribution and pushes the sibling and child slots. This call added "
                f"{new_nodes} node{'s' if new_nodes != 1 else ''} at depth "
                f"{', '.join(map(str, depths)) or '–'}.{best} Because each token is drawn before it is "
                f"known, the sampled tree can still be verified exactly.")
    return None


def expand_note(rec, level: int) -> str:
    if _kind(rec) == "depth-checks":
        for c in rec.checks:
            if c.get("level") == level + 1:
                return (f" DDD checks the beam here: its log mass {c['beam_mass']:.2f} is "
                        f"{'below' if c['stop'] else 'above'} the threshold {rec.threshold}, so it "
                        f"{'stops expanding' if c['stop'] else 'keeps going'}.")
    return ""


def rerank_note(rec) -> str:
    if _kind(rec) != "budget":
        return ""
    best = rec.n if rec.best_n is None else rec.best_n
    text = (f" **Hardware-aware budget:** instead of a fixed N, this cycle's N = {best} maximises "
            f"expected tokens per second, (1 + the sum of the kept values) / (draft time + the target's "
            f"measured time to verify N tokens); it expects {rec.expected_tokens:.2f} tokens. It drafted "
            f"{rec.levels} level(s) past the root's children, each only after predicting that it would "
            f"raise that rate.")
    if best != rec.n:
        text += (f" This cycle verifies N = {rec.n} instead, to re-measure what that size costs on this "
                 f"machine (the budget's t(N) corrects itself from every verification).")
    return text


def accept_note(rec) -> str:
    if _kind(rec) != "relaxation":
        return ""
    return (f" **Lossy:** {rec.rule} acceptance also lets through tokens whose embedding neighbours hold "
            f"target mass; here {rec.relaxed_tokens} accepted token(s) needed the relaxation (largest "
            f"distribution shift {fmt_p(rec.tv_max)}). The output is no longer exactly the target's.")


def _kind(rec) -> str | None:
    return getattr(rec, "kind", None)
