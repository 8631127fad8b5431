"""Explain mode: one cycle replayed phase by phase (expansion levels, rerank, verification,
acceptance), each with a figure and a paragraph. Each phase lays out the tree as it stands then;
nodes keep their order from phase to phase (explain_layout.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from . import record_notes
from .common import esc, fmt_p, show_ws
from .explain_layout import phase_layouts
from .tree_graph import BONUS, draw_tree, tree_graph


class Stage(Enum):
    EXPAND = "Expand"
    RERANK = "Rerank"
    VERIFY = "Verify"
    ACCEPT = "Accept"


@dataclass(frozen=True)
class Phase:
    """One phase of a drafted cycle: an expansion level (`level`: the draft call's level, 0 = the
    call on the root, as in DraftTree.levels), the rerank, the verification or the acceptance."""
    stage: Stage
    level: int | None = None     # EXPAND only

    def __post_init__(self):
        if (self.stage is Stage.EXPAND) != (self.level is not None):
            raise ValueError(f"{self.stage.name} phase with level {self.level!r}")

    @classmethod
    def expand(cls, level: int) -> "Phase":
        return cls(Stage.EXPAND, int(level))

    @property
    def label(self) -> str:
        """The phase's name on the page: "Expand level 1", "Rerank"..."""
        return f"Expand level {self.level + 1}" if self.stage is Stage.EXPAND else self.stage.value


RERANK, VERIFY, ACCEPT = Phase(Stage.RERANK), Phase(Stage.VERIFY), Phase(Stage.ACCEPT)


def phases(step) -> list[tuple[Phase, str]]:
    """(phase, its label) of every phase of a drafted step, in order."""
    t = step.tree
    levels = sorted({lv for lv in t.levels[1:]})
    out = [Phase.expand(lv) for lv in levels]
    if not all(t.kept):
        out.append(RERANK)
    out += [VERIFY, ACCEPT]
    return [(ph, ph.label) for ph in out]


def _beams(step) -> list[list[int]]:
    return [list(b) for b in step.tree.beam]


def explain_figure(step, key: Phase, height: int | None = None):
    """The tree as it stood at one phase, laid out as it stands then and spread over the y axis
    all the cycle's phases share (explain_layout): nodes keep their order from phase to phase and
    the figure its size. Expansion phases show the nodes drafted so far: the root and the nodes
    selected for expansion (those selected now ringed) full size and labelled, the candidates left
    in the pool small and faded; later phases show the whole pool with dropped nodes faded."""
    G = tree_graph(step)
    x_max = max(G.nodes[v]["depth"] for v in G.nodes)
    title = f"Cycle {step.cycle} · {step.policy} · {key.label}"
    lay = phase_layouts(G, _beams(step))[key.level]
    if key.stage is Stage.EXPAND:
        return draw_tree(G, lay.pos, lay.rows, labelled=lay.labelled, rings=lay.rings,
                         ring_name="selected for expansion", small_name="candidates, not selected",
                         show_path=False, title=title, height=height, x_max=x_max)
    dropped = {v for v in G.nodes if G.nodes[v]["kind"] == "dropped"}
    if key.stage is Stage.RERANK:
        return draw_tree(G, lay.pos, lay.rows, faded=dropped, show_path=False, title=title, height=height,
                         x_max=x_max)
    if key.stage is Stage.VERIFY:
        tp = {v: G.nodes[v]["target_prob"] for v in G.nodes}
        return draw_tree(G, lay.pos, lay.rows, faded=dropped, show_path=False, colour_values=tp,
                         colour_title="target prob", title=title, height=height, x_max=x_max)
    return draw_tree(G, lay.pos, lay.rows, faded=dropped, show_path=True, title=title, height=height, x_max=x_max)


def _q(text: str) -> str:
    return f"“{esc(show_ws(text))}”"


def explain_text(step, key: Phase, greedy: bool = True) -> str:
    """One paragraph (Markdown/HTML-safe) explaining what happened in this phase of this cycle."""
    G = tree_graph(step)
    t = step.tree
    rec = t.record
    n = len(t.tokens)
    kept = [i for i in range(1, n) if t.kept[i]]
    beams = _beams(step)
    root = _q(G.nodes[0]["text"])
    max_level = max(t.levels[1:]) if n > 1 else 0
    if key.stage is Stage.EXPAND:
        lv = key.level
        new = [i for i in range(1, n) if t.levels[i] == lv]
        best = max(new, key=lambda i: t.values[i]) if new else None
        best_s = f" The most likely one is {_q(G.nodes[best]['text'])} (path value {fmt_p(G.nodes[best]['pv'])})." if best else ""
        own = record_notes.expand_text(rec, lv, len(new), sorted({t.depths[i] for i in new}), best_s)
        if own:  # a policy that grows its tree its own way describes the step itself
            return own
        if not beams:  # a static shape
            return (f"**Expansion level {lv + 1}.** The draft head runs once on the nodes of depth {lv} that have "
                    f"children in the fixed tree shape and adds their top-ranked children: {len(new)} nodes at "
                    f"depth {lv + 1}.{best_s} A static tree (EAGLE-1) always has the same shape, whatever the context.")
        if lv == 0:
            return (f"**Expansion level 1.** The draft head reads the context (the target's own features of the "
                    f"accepted tokens) and proposes the children of the root {root}: its top-{len(new)} next "
                    f"tokens. A node's *value* is the product of draft probabilities along its path; here it is "
                    f"just the child's probability.{best_s} All of them are selected for expansion (ringed).")
        parents = len({t.parents[i] for i in new})
        mass = t.beam_mass
        sel = ""
        if lv < len(beams) and lv < max_level:
            m = f", holding {fmt_p(math.exp(mass[lv]))} of the draft's probability mass" if lv < len(mass) else ""
            sel = (f" The {len(beams[lv])} highest-value candidates of the whole level (ringed) are selected "
                   f"for the next expansion{m}; the rest stay in the pool as candidates.")
        else:
            sel = " This is the last level (the depth limit); the pool is complete."
        sel += record_notes.expand_note(rec, lv)
        return (f"**Expansion level {lv + 1}.** The head runs once, in parallel, on the {parents} nodes selected "
                f"at the previous level (each attends to the context and its own ancestors) and gives each its "
                f"top-k children: {len(new)} new candidates at depth {lv + 1}. A child's value = its parent's "
                f"value × its draft probability, the draft's estimate of the chance that the target accepts "
                f"it.{best_s}{sel}")
    if key.stage is Stage.RERANK:
        dropped = n - 1 - len(kept)
        own_note = record_notes.rerank_note(rec)
        return (f"**Rerank.** Expansion drafted {n - 1} candidates. EAGLE-2 keeps the {len(kept)} of highest "
                f"value (ties go to shallower nodes) and makes sure every kept node's ancestors are kept, so the "
                f"root plus these form the {len(kept) + 1} tokens the target verifies. The {dropped} faded nodes "
                f"cost draft compute but no target compute. Because values depend on the context, the shape of "
                f"the kept tree changes from cycle to cycle: a *dynamic* draft tree.{own_note}")
    if key.stage is Stage.VERIFY:
        tps = [(t.target_prob[i] or 0.0, i) for i in kept] if t.target_prob else []
        best = max(tps) if tps else None
        b = (f" The target likes {_q(G.nodes[best[1]]['text'])} most ({fmt_p(best[0])})." if best else "")
        return (f"**Verification.** The target runs the root and all {len(kept)} kept tokens in ONE forward "
                f"pass with a tree attention mask: each token sees the committed context, its ancestors and "
                f"itself, at position context length + depth. This yields the target's next-token "
                f"distribution after every node. Colour now shows the target's probability of each draft token "
                f"given its parent.{b}")
    path = list(step.accepted_path)
    acc_txt = " ".join(_q(G.nodes[i]["text"]) for i in path) or "none"
    bonus = _q(G.nodes[BONUS]["text"]) if BONUS in G else "–"
    if greedy:
        rule = ("a child is accepted if it is the target's top choice at its parent, and the longest such path "
                "wins")
    elif t.sampled_drafts:
        rule = ("the sampled children are tried in the order they were drawn: child x is accepted with "
                "probability min(1, p(x)/q(x)) (target over draft); after a rejection the target's residual "
                "max(p - q, 0) is renormalised (SpecInfer's rule), which keeps the output distribution exactly "
                "the target's")
    else:
        rule = ("the children of a node are tried in rank order and child x is accepted with the target's "
                "probability p(x); after a rejection p(x) is set to 0 and p renormalised, which keeps the output "
                "distribution exactly the target's")
    lossy = record_notes.accept_note(rec)
    return (f"**Acceptance.** Walking down from the root, {rule}. Accepted here: {len(path)} draft token"
            f"{'s' if len(path) != 1 else ''} ({acc_txt}). The target's own token after the last accepted node "
            f"is the bonus {bonus}, so this cycle emits {len(path) + 1} token{'s' if path else ''} for one target "
            f"forward. The bonus is the next cycle's root; the keys/values of the accepted tokens are kept and the "
            f"rest are discarded.{lossy}")
