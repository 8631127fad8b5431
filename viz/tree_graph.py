"""The draft tree of one cycle as a networkx DiGraph, a tidy layered layout, and a Plotly figure.

Layout: root at the left, depth along x. Every node owns a vertical band; bands of nodes at the
same depth never intersect and a node sits in the middle of its band, so labels never overlap.
Labelled nodes (root, verified nodes, the bonus) get a band of at least one row; dropped pool
nodes (unlabelled, faded) get a thin band, so ~500 of them fit beside a 60-node tree.
"""
from __future__ import annotations

import networkx as nx
import plotly.graph_objects as go

from .common import (new_figure, ACCEPT_COLOUR, CONFIDENCE_SCALE, DROPPED_COLOUR, base_layout, esc, fmt_p,
                     p_of, show_ws)

BONUS = "bonus"
ROW_PX = 15          # pixels per labelled row at the default height
LABEL_CHARS = 11     # token labels longer than this are cut with an ellipsis


def tree_graph(step) -> nx.DiGraph:
    """DiGraph of a StepTrace's pool: node = pool index (0 = root), plus the bonus token as node
    "bonus" after the last accepted node. Attributes: token, text, depth, rank, level, p (draft
    probability given the parent), pv (path value), logv, kept, accepted, target_prob, kind."""
    t = step.tree
    if t is None:
        raise ValueError("This step has no draft tree (prefill or plain decoding).")
    texts = list(step.tree_texts or [])
    n = len(t.tokens)
    tp = list(t.target_prob) if t.target_prob else [None] * n
    acc = list(t.accepted) if t.accepted else [i == 0 for i in range(n)]
    path = [int(i) for i in (step.accepted_path or [])]
    on_path = set(path)
    G = nx.DiGraph(cycle=step.cycle, policy=step.policy, accepted_path=path)
    for i in range(n):
        kept = bool(t.kept[i])
        kind = "root" if i == 0 else ("kept" if kept else "dropped")
        G.add_node(i, token=int(t.tokens[i]), text=texts[i] if i < len(texts) else f"<{t.tokens[i]}>",
                   depth=int(t.depths[i]), rank=int(t.ranks[i]), level=int(t.levels[i]),
                   p=1.0 if i == 0 else p_of(t.logp[i]), pv=p_of(t.values[i]), logv=float(t.values[i]),
                   kept=kept, accepted=bool(acc[i]) if i < len(acc) else False, on_path=i in on_path,
                   target_prob=tp[i] if i < len(tp) else None, kind=kind)
    for i in range(1, n):
        G.add_edge(int(t.parents[i]), i)
    if step.bonus is not None:
        last = path[-1] if path else 0
        btext = step.new_texts[len(path)] if len(step.new_texts) > len(path) else f"<{step.bonus}>"
        G.add_node(BONUS, token=int(step.bonus), text=btext, depth=G.nodes[last]["depth"] + 1, rank=-1,
                   level=-1, p=None, pv=None, logv=None, kept=True, accepted=True, on_path=True,
                   target_prob=None, kind="bonus")
        G.add_edge(last, BONUS)
    return G


def path_nodes(G: nx.DiGraph) -> list:
    """Root, accepted nodes and the bonus, in order: the highlighted path."""
    out = [0] + list(G.graph.get("accepted_path", []))
    if BONUS in G:
        out.append(BONUS)
    return out


def _children(G, u, visible):
    ch = [v for v in G.successors(u) if v in visible]
    return sorted(ch, key=lambda v: (G.nodes[v]["rank"], -1 if v == BONUS else v))


def layout(G: nx.DiGraph, visible=None, labelled=None, dropped_share: float = 0.6) -> tuple[dict, float]:
    """Positions {node: (x=depth, y=row)} for the visible nodes, and the total height in rows.

    Labelled nodes need a one-row band; the others share at most `dropped_share` x the labelled
    leaves' height (and at most 0.35 row each)."""
    visible = set(G.nodes) if visible is None else set(visible)
    labelled = {v for v in visible if G.nodes[v]["kind"] != "dropped"} if labelled is None else set(labelled)
    leaves = [v for v in visible if not any(c in visible for c in G.successors(v))]
    lab_leaves = sum(1 for v in leaves if v in labelled) or 1
    other_leaves = len(leaves) - sum(1 for v in leaves if v in labelled)
    w_other = min(0.35, max(0.03, dropped_share * lab_leaves / max(1, other_leaves)))

    span: dict = {}
    order = list(nx.dfs_postorder_nodes(G, 0))
    for u in order:
        if u not in visible:
            continue
        own = 1.0 if u in labelled else w_other
        span[u] = max(own, sum(span[c] for c in _children(G, u, visible)))
    pos: dict = {}
    stack = [(0, 0.0)]
    while stack:
        u, top = stack.pop()
        pos[u] = (float(G.nodes[u]["depth"]), top + span[u] / 2)
        ch = _children(G, u, visible)
        inner = sum(span[c] for c in ch)
        cur = top + (span[u] - inner) / 2
        for c in ch:
            stack.append((c, cur))
            cur += span[c]
    return pos, span.get(0, 1.0)


def _hover(d: dict) -> str:
    tok = esc(show_ws(d["text"]))
    if d["kind"] == "root":
        return (f"<b>root</b> {tok}  (id {d['token']})<br>the token the tree grows from<br>"
                f"(the previous cycle's bonus)")
    if d["kind"] == "bonus":
        return (f"<b>bonus</b> {tok}  (id {d['token']})<br>sampled by the target after the<br>"
                f"last accepted node; next cycle's root")
    status = ("accepted" if d["accepted"] else "rejected") if d["kept"] else "dropped by rerank"
    return (f"<b>{tok}</b>  (id {d['token']})<br>"
            f"draft prob  {fmt_p(d['p'])}<br>path value  {fmt_p(d['pv'])}  (log {d['logv']:.2f})<br>"
            f"depth {d['depth']} · rank {d['rank']} · level {d['level'] + 1}<br>"
            f"target prob {fmt_p(d['target_prob'])}<br>{status}")


def _size(pv) -> float:
    return 9.0 + 17.0 * (pv or 0.0) ** 0.5


def draw_tree(G: nx.DiGraph, pos: dict, rows: float, *, colour_by: str = "value", labelled=None,
              faded=(), rings=(), ring_name: str = "selected", show_path: bool = True,
              colour_values: dict | None = None, colour_title: str | None = None,
              title: str | None = None, height: int | None = None, x_max: float | None = None) -> go.Figure:
    """Draw the positioned nodes. colour_by: 'value' (path value) or 'prob' (the node's own draft
    probability); colour_values overrides both (e.g. the target's probabilities)."""
    faded = set(faded) & set(pos)
    labelled = set(pos) - faded if labelled is None else set(labelled) & set(pos)
    fig = new_figure()
    _add_edges(fig, G, pos, [v for v in pos if v in faded], "#e5e7eb", 0.8, "edges (dropped)")
    _add_edges(fig, G, pos, [v for v in pos if v not in faded and v not in labelled], "#cbd5e1", 0.8,
               "edges (unlabelled)")
    _add_edges(fig, G, pos, [v for v in pos if v not in faded and v in labelled], "#94a3b8", 1.4, "edges")
    on_path = [v for v in path_nodes(G) if v in pos] if show_path else []
    if len(on_path) > 1:
        fig.add_trace(go.Scatter(x=[pos[v][0] for v in on_path], y=[pos[v][1] for v in on_path],
                                 mode="lines", line=dict(color=ACCEPT_COLOUR, width=5), opacity=0.8,
                                 hoverinfo="skip", name="accepted path"))
    if faded:
        fn = sorted(faded, key=str)
        fig.add_trace(go.Scatter(
            x=[pos[v][0] for v in fn], y=[pos[v][1] for v in fn], mode="markers", name="dropped by rerank",
            marker=dict(size=6, color=DROPPED_COLOUR, opacity=0.45, line=dict(width=0)),
            customdata=[str(v) for v in fn], hovertemplate="%{text}<extra></extra>",
            text=[_hover(G.nodes[v]) for v in fn]))
    main = [v for v in pos if v not in faded and G.nodes[v]["kind"] in ("kept", "dropped")]
    main.sort(key=lambda v: (pos[v][0], pos[v][1]))
    if main:
        _add_draft_nodes(fig, G, pos, main, labelled, *_node_colours(G, main, colour_by, colour_values, colour_title))
    _add_rings(fig, G, pos, [v for v in rings if v in pos], ring_name, "#059669", 8)
    _add_rings(fig, G, pos, [v for v in on_path if G.nodes[v]["kind"] == "kept"], "accepted", ACCEPT_COLOUR, 7)
    _add_end_token(fig, G, pos, 0, "root", "#111827", dict(symbol="square", size=16, color="#111827"), legend=False)
    if BONUS in pos and show_path:
        _add_end_token(fig, G, pos, BONUS, "bonus token", ACCEPT_COLOUR,
                       dict(symbol="star", size=20, color=ACCEPT_COLOUR, line=dict(width=1, color="#7f1d1d")))
    max_depth = x_max if x_max is not None else max((p[0] for p in pos.values()), default=1)
    _finish_layout(fig, title, height or int(min(1500, max(420, rows * ROW_PX + 110))), rows, max_depth)
    return fig


def _add_edges(fig, G, pos, nodes, colour, width, name) -> None:
    xs, ys = [], []
    for v in nodes:
        preds = list(G.predecessors(v))
        if not preds or preds[0] not in pos:
            continue
        (x0, y0), (x1, y1) = pos[preds[0]], pos[v]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, width=width),
                             hoverinfo="skip", name=name, showlegend=False))


def _node_colours(G, main, colour_by, colour_values, colour_title) -> tuple[list, str]:
    if colour_values is not None:
        return [colour_values.get(v) or 0.0 for v in main], colour_title or "probability"
    if colour_by == "prob":
        return [G.nodes[v]["p"] for v in main], "draft prob"
    return [G.nodes[v]["pv"] for v in main], "path value"


def _add_draft_nodes(fig, G, pos, main, labelled, cvals, ctitle) -> None:
    fig.add_trace(go.Scatter(
        x=[pos[v][0] for v in main], y=[pos[v][1] for v in main], mode="markers+text",
        name="draft nodes", customdata=[str(v) for v in main],
        text=[esc(show_ws(G.nodes[v]["text"], LABEL_CHARS)) if v in labelled else "" for v in main],
        textposition="middle right", textfont=dict(size=12, color="#111827", shadow="auto"),
        hovertext=[_hover(G.nodes[v]) for v in main], hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(size=[_size(G.nodes[v]["pv"]) if v in labelled else 6 for v in main], color=cvals,
                    cmin=0.0, cmax=1.0, colorscale=CONFIDENCE_SCALE,
                    line=dict(width=[1 if v in labelled else 0.3 for v in main], color="#334155"),
                    colorbar=dict(title=dict(text=ctitle, side="right"), thickness=12, lenmode="pixels",
                                  len=200, y=1.0, yanchor="top", x=1.0, xanchor="left",
                                  tickformat=".1f"))))


def _add_rings(fig, G, pos, nodes, name, colour, grow) -> None:
    """Open circles around nodes (selected for expansion, or accepted), `grow` px past the node."""
    if not nodes:
        return
    fig.add_trace(go.Scatter(
        x=[pos[v][0] for v in nodes], y=[pos[v][1] for v in nodes], mode="markers", name=name,
        customdata=[str(v) for v in nodes], hoverinfo="skip",
        marker=dict(symbol="circle-open", size=[_size(G.nodes[v]["pv"]) + grow for v in nodes],
                    color=colour, line=dict(width=3, color=colour))))


def _add_end_token(fig, G, pos, v, name, colour, marker, legend: bool = True) -> None:
    """The root or the bonus token: a bold label and its own marker."""
    fig.add_trace(go.Scatter(
        x=[pos[v][0]], y=[pos[v][1]], mode="markers+text", name=name,
        text=[esc(show_ws(G.nodes[v]["text"], LABEL_CHARS))], textposition="middle right",
        textfont=dict(size=13, color=colour, shadow="auto", weight="bold"),
        hovertext=[_hover(G.nodes[v])], hovertemplate="%{hovertext}<extra></extra>",
        marker=marker, showlegend=legend))


def _finish_layout(fig, title, height, rows, max_depth) -> None:
    fig.update_layout(**base_layout(title, height=height))
    # the legend sits under the depth axis: above the plot it collided with long titles in the
    # half-width side-by-side panels (both wrap there)
    fig.update_layout(margin=dict(l=16, r=16, t=56 if title else 30, b=84), hovermode="closest",
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xanchor="left", x=0.0,
                                  font=dict(size=12)), dragmode="pan")
    fig.update_xaxes(range=[-0.35, max_depth + 0.95], dtick=1, title=dict(text="depth", font=dict(size=12)),
                     showgrid=True, gridcolor="#f1f5f9", zeroline=False, tickfont=dict(size=12))
    fig.update_yaxes(range=[rows + 0.3, -0.3], visible=False)


def tree_title(step) -> str:
    t = step.tree
    n_pool, n_kept = len(t.tokens) - 1, sum(bool(k) for k in t.kept) - 1
    acc = step.accepted_len
    return (f"Cycle {step.cycle} · {step.policy}: {n_kept} of {n_pool} drafted tokens verified · "
            f"accepted {acc} + bonus = {acc + 1} token{'s' if acc else ''}")


def tree_figure(step, colour_by: str = "value", show_dropped: bool = False, title: str | None = None,
                height: int | None = None) -> go.Figure:
    """The interactive tree of one cycle: accepted path highlighted, bonus after it, dropped pool
    nodes faded (when show_dropped)."""
    G = tree_graph(step)
    if show_dropped:
        visible = set(G.nodes)
    else:
        visible = {v for v in G.nodes if G.nodes[v]["kind"] != "dropped"}
    faded = {v for v in visible if G.nodes[v]["kind"] == "dropped"}
    pos, rows = layout(G, visible)
    return draw_tree(G, pos, rows, colour_by=colour_by, faded=faded,
                     title=tree_title(step) if title is None else title, height=height)


def empty_figure(message: str, height: int = 320) -> go.Figure:
    """A blank figure with a centred message (no trace yet, plain decoding...)."""
    fig = new_figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=15, color="#6b7280"))
    fig.update_layout(**base_layout(None, height=height))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig
