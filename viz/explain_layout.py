"""Where "Explain a cycle" draws each node, phase by phase.

Each phase lays out the tree as it stands at that phase (tree_graph.layout: depth along x, every
node in a band of its own) and stretches it over the y axis that all phases of the cycle share,
so the tree fills the plot from the first expansion on. Laid out as the final tree instead, the
first level's ten children sat in half the plot, nine of them crammed at its bottom, because the
bands the final tree gives their subtrees are all they get.

Nodes keep their order from phase to phase: a layout orders siblings by rank and the bands at
one depth never cross, so adding nodes moves a node along its column but never past another.

What a phase shows: during an expansion, the nodes drafted so far, with the root and the nodes
selected for expansion (by this draft call or an earlier one) full size and labelled, the other
candidates small and faded, as they wait in the pool. From the rerank on, the whole pool, the
nodes the rerank dropped faded, and the bonus laid out after the last accepted node (drawn only
at acceptance), so the last three phases share one layout: the tree does not change there.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .tree_graph import BONUS, layout


@dataclass(frozen=True)
class PhaseLayout:
    pos: dict        # node -> (depth, row), rows counted on the cycle's shared y axis
    rows: float      # that axis's rows: the most any phase of the cycle needs
    labelled: set    # drawn full size, may carry a label; the others are drawn small
    rings: list      # the nodes this phase's draft call selects for expansion


def expansion_levels(G: nx.DiGraph) -> list[int]:
    """The draft calls' levels (0 = the call on the root), as DraftTree.levels numbers them."""
    return sorted({G.nodes[v]["level"] for v in G.nodes if v not in (0, BONUS)})


def _expansion(G: nx.DiGraph, beams: list, level: int) -> tuple[set, set, list]:
    """(visible, labelled, rings) after the draft call of `level`."""
    visible = {v for v in G.nodes if v != BONUS and (v == 0 or G.nodes[v]["level"] <= level)}
    last = max(expansion_levels(G), default=0)
    # the last call's beam (DDD records one before it stops) is expanded by no call: nothing is selected
    rings = [v for v in beams[level] if v in visible] if level < len(beams) and level < last else []
    if beams:
        labelled = {0} | {v for b in beams[:level] for v in b} | set(rings)
    else:   # a static shape selects nothing: every node it drafts is verified
        labelled = {v for v in visible if G.nodes[v]["kind"] != "dropped"}
    return visible, labelled & visible, rings


def _stretched(pos: dict, rows: float, to_rows: float) -> dict:
    """pos laid out on `rows` rows, spread over `to_rows` ([-0.5, rows + 0.5] onto [-0.5, to_rows + 0.5])."""
    k = (to_rows + 1.0) / (rows + 1.0)
    return {v: (x, (y + 0.5) * k - 0.5) for v, (x, y) in pos.items()}


def phase_layouts(G: nx.DiGraph, beams: list) -> dict:
    """{level: the layout of the phase after the draft call of `level`, None: the layout of the
    rerank, the verification and the acceptance}. `beams`: the tree's beam (what each call selected)."""
    raw = {}
    for lv in expansion_levels(G):
        visible, labelled, rings = _expansion(G, beams, lv)
        raw[lv] = layout(G, visible, labelled) + (labelled, rings)
    kept = {v for v in G.nodes if G.nodes[v]["kind"] != "dropped"}
    raw[None] = layout(G, set(G.nodes), kept) + (kept, [])
    rows = max(r[1] for r in raw.values())
    return {lv: PhaseLayout(_stretched(pos, own, rows), rows, labelled, rings)
            for lv, (pos, own, labelled, rings) in raw.items()}
