"""The draft tree of one cycle as a networkx DiGraph, a tidy layered layout, and a Plotly figure.

Layout: root at the left, depth along x. Every node owns a vertical band; bands of nodes at the
same depth never intersect and a node sits in the middle of its band (the last accepted node sits
at the top of its own, above the bonus). Nodes that may carry a label (root, kept nodes, the
bonus) get a band of at least one row; dropped pool nodes (faded) get a thin band, so ~500 of
them fit beside a 60-node tree.

Labels: a label is drawn beside its node (right of it; above or below to the right; left of it
for the root, the accepted path and the bonus) and may reach into the next depth columns, so not
every node can have one. `plan_labels` places them greedily on the figure's pixel grid: the root,
the accepted path and the bonus first, then the other nodes by path value, each where its text
box meets no other label and no node, cut short (with an ellipsis) to the room it has or left to
the hover text. The grid is the figure's own height and rows, and the width of the narrowest
panel the page draws a tree in (MIN_WIDTH_PX): a wider figure only moves the columns apart, so
the plan holds at every width from a phone's up.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import plotly.graph_objects as go

from .common import (figure, ACCEPT_COLOUR, CONFIDENCE_SCALE, DROPPED_COLOUR, base_layout, esc, fmt_p,
                     p_of, show_ws, text_px, title_html, wrap_title)

BONUS = "bonus"
ROW_PX = 15          # pixels per row at the default height (a label's text box is ~14 px tall)
LABEL_CHARS = 11     # token labels longer than this are cut with an ellipsis
MIN_LABEL_CHARS = 2  # a label cut to fewer characters than this (and an ellipsis) is left to the hover
LABEL_SIZE = 12      # px, node labels
END_SIZE = 13        # px, the root's and the bonus's labels (bold)
MIN_WIDTH_PX = 320   # the narrowest figure the page draws a tree in (390 px phone; the comparison panel)
MARGIN_X = 10        # px, left and right margins
RIGHT_ROOM_PX = 64   # px right of the deepest column, for its labels
X_LEFT = -0.35       # the x axis starts this far left of the root
AXIS_PX = 46         # px under the plot: depth ticks and the axis title
COLORBAR_PX = 40     # px under the axis: the horizontal colour bar and its ticks
LEGEND_PX = 52       # px under the colour bar: the legend, two lines at phone width
TITLE_LINE_PX = 21   # px per title line (Plotly spaces lines by 1.3 x the 16 px title font)
POSITIONS = ("middle right", "top right", "bottom right")   # where a label may go, in order of preference
LIFT_ROWS = 1.5      # rows the last accepted node has to itself above its children (its label clears the bonus)
LEFT = "middle left"  # where a root/path/bonus label may also go, when its right is full (a dense fan)


def tree_graph(step) -> nx.DiGraph:
    """DiGraph of a StepTrace's pool: node = pool index (0 = root), plus the bonus token as node
    "bonus" after the last accepted node. Attributes: token, text, depth, rank, level, p (draft
    probability given the parent), pv (path value), logv, kept, accepted, target_prob, kind."""
    t = step.tree
    if t is None:
        raise ValueError("This step has no draft tree (prefill or plain decoding).")
    texts = list(step.tree_texts)   # empty when the run was not recorded with texts
    n = len(t.tokens)
    tp = list(t.target_prob) if t.target_prob else [None] * n
    acc = list(t.accepted) if t.accepted else [i == 0 for i in range(n)]
    path = [int(i) for i in step.accepted_path]
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
    out = [0] + list(G.graph["accepted_path"])
    if BONUS in G:
        out.append(BONUS)
    return out


def _children(G, u, visible):
    ch = [v for v in G.successors(u) if v in visible]
    return sorted(ch, key=lambda v: (G.nodes[v]["rank"], -1 if v == BONUS else v))


def layout(G: nx.DiGraph, visible=None, labelled=None, dropped_share: float = 0.6) -> tuple[dict, float]:
    """Positions {node: (x=depth, y=row)} for the visible nodes, and the total height in rows.

    Labelled nodes need a one-row band; the others share at most `dropped_share` x the labelled
    leaves' height (and at most 0.35 row each). A node sits in the middle of its children, except
    the last accepted node when the bonus is visible: it has LIFT_ROWS of its own at the top of
    its band, the bonus and its other children under it, so its label does not run into the
    bonus star (its only child, often, and then at the same height)."""
    visible = set(G.nodes) if visible is None else set(visible)
    labelled = {v for v in visible if G.nodes[v]["kind"] != "dropped"} if labelled is None else set(labelled)
    path = [0] + list(G.graph["accepted_path"])
    lifted = {path[-1]} & visible - {0} if BONUS in visible else set()
    leaves = [v for v in visible if not any(c in visible for c in G.successors(v))]
    lab_leaves = sum(1 for v in leaves if v in labelled) or 1
    other_leaves = len(leaves) - sum(1 for v in leaves if v in labelled)
    w_other = min(0.35, max(0.03, dropped_share * lab_leaves / max(1, other_leaves)))

    span: dict = {}
    own: dict = {}
    order = list(nx.dfs_postorder_nodes(G, 0))
    for u in order:
        if u not in visible:
            continue
        own[u] = LIFT_ROWS if u in lifted else (1.0 if u in labelled else w_other)
        inner = sum(span[c] for c in _children(G, u, visible))
        span[u] = own[u] + inner if u in lifted and inner else max(own[u], inner)
    pos: dict = {}
    stack = [(0, 0.0)]
    while stack:
        u, top = stack.pop()
        ch = _children(G, u, visible)
        inner = sum(span[c] for c in ch)
        if u in lifted and ch:
            pos[u] = (float(G.nodes[u]["depth"]), top + own[u] / 2)
            cur = top + own[u]
        else:
            pos[u] = (float(G.nodes[u]["depth"]), top + span[u] / 2)
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


@dataclass(frozen=True)
class Frame:
    """The figure's pixel grid: margins, the plot area at the assumed (narrowest) width, and the
    axis ranges. px() maps data coordinates (depth, row) to pixels from the plot's top left."""
    height: int
    top: int
    bottom: int
    rows: float
    x0: float
    x1: float

    @property
    def plot_h(self) -> float:
        return float(self.height - self.top - self.bottom)

    @property
    def plot_w(self) -> float:
        return float(MIN_WIDTH_PX - 2 * MARGIN_X)

    @property
    def row_px(self) -> float:
        return self.plot_h / (self.rows + 1.0)          # the y range is [rows + 0.5, -0.5]

    @property
    def col_px(self) -> float:
        return self.plot_w / (self.x1 - self.x0)

    def px(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.x0) * self.col_px, (y + 0.5) * self.row_px


def frame_for(rows: float, x_max: float, title_lines: int, height: int | None = None) -> Frame:
    """The grid of a tree figure with `rows` rows, depth up to `x_max` and a title of
    `title_lines` lines (two reserved); height None: ROW_PX per row, within 420..1500 px."""
    top = 16 + TITLE_LINE_PX * max(2, title_lines)
    bottom = AXIS_PX + COLORBAR_PX + LEGEND_PX
    if height is None:
        height = int(min(1500, max(420, (rows + 1.0) * ROW_PX + top + bottom)))
    col = (MIN_WIDTH_PX - 2 * MARGIN_X - RIGHT_ROOM_PX) / (max(x_max, 1.0) - X_LEFT)
    return Frame(int(height), top, bottom, float(rows), X_LEFT, max(x_max, 1.0) + RIGHT_ROOM_PX / col)


def label_box(px: float, py: float, size: float, width: float, font: float, position: str) -> tuple:
    """(x0, y0, x1, y1), in pixels, of a label `width` px wide at `position` beside a marker of
    diameter `size` centred at (px, py), as Plotly draws it: offset by the radius / 0.8 + 1 to the
    right (or left), baseline 0.25 em below the centre (middle), or the offset above (top) or
    below (bottom) it."""
    off = size / 2 / 0.8 + 1
    vert, side = position.split()
    base = {"middle": 0.25 * font, "top": -0.25 * font - off, "bottom": 0.75 * font + off}[vert]
    x0 = px + off if side == "right" else px - off - width
    return (x0, py + base - 0.93 * font, x0 + width, py + base + 0.24 * font)


def _fit(text: str, room: float, font: float, bold: bool, shortest: int) -> str | None:
    """The longest cut of `text` (shown with visible whitespace, at most LABEL_CHARS, an ellipsis
    marking a cut) that is at most `room` px wide, or None when fewer than `shortest` of its
    characters would show."""
    s = show_ws(text)
    for n in range(min(len(s), LABEL_CHARS), 0, -1):
        shown = n if n >= len(s) else n - 1
        if shown < min(len(s), shortest):
            return None
        cut = show_ws(text, n)
        if text_px(cut, font, bold) <= room:
            return cut
    return None


def plan_labels(G: nx.DiGraph, pos: dict, frame: Frame, sizes: dict, extents: dict, must, optional) -> dict:
    """{node: (label, textposition)} for as many nodes as fit: every node of `must` (in order),
    then those of `optional` (in order). `sizes`: node -> its marker's diameter in px (the label's
    offset); `extents`: node -> the diameter it covers, rings included. A label's box may not meet
    another label's, any node's extent or the plot's edges; it is cut to the room it has. A
    must-label that finds no such room (a dense fan at phone width) goes to its node's right over
    the nodes there, where it meets no other label (and no other must-node if it can)."""
    pts = {v: frame.px(*pos[v]) for v in extents}
    marks = [((x - extents[v] / 2, y - extents[v] / 2, x + extents[v] / 2, y + extents[v] / 2), v)
             for v, (x, y) in pts.items()]
    placed: list = []
    out: dict = {}

    must = [v for v in dict.fromkeys(must) if v in pts]
    key_marks = [m for m in marks if m[1] in set(must)]

    def fit(v, position, in_way, shortest):
        """(label, box) of v at `position` among the obstacles `in_way`, or None."""
        end = v in (0, BONUS)
        font = END_SIZE if end else LABEL_SIZE
        x0, y0, x1, y1 = label_box(*pts[v], sizes[v], 0.0, font, position)
        if y0 < -2 or y1 > frame.plot_h + 2:
            return None
        near = [(b, o) for b, o in in_way if o != v and b[3] > y0 and b[1] < y1]
        if position == LEFT:
            # the gap back to the previous column must hold no node at this height, or the label
            # reads as that node's
            gap = pts[v][0] - frame.col_px - 2
            if any(b[2] > gap and b[0] < x1 for b, o in marks if o != v and b[3] > y0 and b[1] < y1):
                return None
            free = x1 - max([0.0] + [b[2] for b, o in near if b[0] < x1])
        else:
            # above or below its node, a label must have that slot of its column to itself, or it
            # reads as the label of the node beside it
            left = x0 if position == "middle right" else pts[v][0] - 2
            free = min([frame.plot_w - x0] + [b[0] - x0 for b, o in near if b[2] > left])
        text = _fit(G.nodes[v]["text"], free, font, end, shortest)
        if not text:
            return None
        w = text_px(text, font, end)
        return text, ((x0, y0, x0 + w, y1) if position != LEFT else (x1 - w, y0, x1, y1))

    def place(v, in_way: list, shortest: int, positions) -> bool:
        """Label v where the longest cut of its text fits (ties: the first such position)."""
        best = None
        for position in positions:
            got = fit(v, position, placed + in_way, shortest)
            if got and (best is None or len(got[0]) > len(best[1][0])):
                best = (position, got)
        if best is None:
            return False
        position, (text, box) = best
        out[v] = (text, position)
        placed.append((box, v))
        return True

    seen = set(must)
    for v in must:   # at its right, over other nodes, reads better than above or below another node
        (place(v, marks, MIN_LABEL_CHARS, POSITIONS + (LEFT,))
         or place(v, key_marks, MIN_LABEL_CHARS, POSITIONS[:1])   # a cut to one character reads as none
         or place(v, [], 1, POSITIONS[:1]) or place(v, [], 1, POSITIONS))
    for v in optional:
        if v in pts and v not in seen:
            seen.add(v)
            place(v, marks, MIN_LABEL_CHARS, POSITIONS)
    return out


ROOT_SIZE, BONUS_SIZE, FADED_SIZE = 16.0, 20.0, 6.0
SMALL_OPACITY = 0.45   # the dropped and the unlabelled nodes' markers: present, but behind the tree
RING_GROW = {"accepted": 7, "selected": 8}


def draw_tree(G: nx.DiGraph, pos: dict, rows: float, *, colour_by: str = "value", labelled=None,
              faded=(), rings=(), ring_name: str = "selected", small_name: str = "not labelled",
              show_path: bool = True,
              colour_values: dict | None = None, colour_title: str | None = None,
              title: str | None = None, height: int | None = None, x_max: float | None = None) -> go.Figure:
    """Draw the positioned nodes. labelled: the nodes that may carry a label and are drawn at full
    size (default: all but the faded); the others are drawn small and faded, unlabelled, in a
    trace of their own named `small_name`. plan_labels picks which labelled nodes carry a label:
    the root, the accepted path and the bonus (show_path), the ringed nodes, then the rest by path
    value. colour_by: 'value' (path value) or 'prob' (the node's own draft probability);
    colour_values overrides both (e.g. the target's probabilities). A long title is wrapped onto
    two or three lines."""
    if not show_path:    # an explain phase before acceptance lays the bonus out but does not draw it
        pos = {v: p for v, p in pos.items() if v != BONUS}
    faded = set(faded) & set(pos)
    labelled = set(pos) - faded if labelled is None else set(labelled) & set(pos)
    on_path = [v for v in path_nodes(G) if v in pos] if show_path else []
    rings = [v for v in rings if v in pos]
    lines = wrap_title(title) if title else []
    max_depth = x_max if x_max is not None else max((p[0] for p in pos.values()), default=1)
    frame = frame_for(rows, max_depth, len(lines), height)

    sizes = {v: FADED_SIZE if (v in faded or v not in labelled) else _size(G.nodes[v]["pv"]) for v in pos}
    sizes[0] = ROOT_SIZE
    if BONUS in sizes:
        sizes[BONUS] = BONUS_SIZE
    # a ringed node's label is drawn by its ring's trace, so Plotly offsets it past the ring
    path_rings = [v for v in on_path if G.nodes[v]["kind"] == "kept"]
    ringed = {v: RING_GROW["selected"] for v in rings} | {v: RING_GROW["accepted"] for v in path_rings}
    extents = dict(sizes)
    for v, grow in ringed.items():
        sizes[v] = _size(G.nodes[v]["pv"]) + grow
        extents[v] = sizes[v] + 3                            # the ring's line
    must = [0] + [v for v in on_path if v != 0] + rings
    optional = sorted((v for v in labelled if v in sizes and v not in faded),
                      key=lambda v: (-(G.nodes[v]["logv"] or 0.0), str(v)))
    labels = plan_labels(G, pos, frame, sizes, extents, must, optional)

    # the traces as plain dicts, the figure made once from them and the whole layout: each
    # add_trace and update_layout on a Figure re-validates it (5 ms apiece; a tree took 60 ms)
    traces: list[dict] = []
    _add_edges(traces, G, pos, [v for v in pos if v in faded], "#e5e7eb", 0.8, "edges (dropped)")
    _add_edges(traces, G, pos, [v for v in pos if v not in faded and v not in labelled], "#cbd5e1", 0.8,
               "edges (unlabelled)")
    _add_edges(traces, G, pos, [v for v in pos if v not in faded and v in labelled], "#94a3b8", 1.4, "edges")
    if len(on_path) > 1:
        traces.append(scatter(x=[pos[v][0] for v in on_path], y=[pos[v][1] for v in on_path],
                              mode="lines", line=dict(color=ACCEPT_COLOUR, width=5), opacity=0.8,
                              hoverinfo="skip", name="accepted path"))
    if faded:
        fn = sorted(faded, key=str)
        traces.append(scatter(
            x=[pos[v][0] for v in fn], y=[pos[v][1] for v in fn], mode="markers", name="dropped by rerank",
            marker=dict(size=FADED_SIZE, color=DROPPED_COLOUR, opacity=SMALL_OPACITY, line=dict(width=0)),
            customdata=[str(v) for v in fn], hovertemplate="%{text}<extra></extra>",
            text=[_hover(G.nodes[v]) for v in fn]))
    drafted = sorted((v for v in pos if v not in faded and G.nodes[v]["kind"] in ("kept", "dropped")),
                     key=lambda v: (pos[v][0], pos[v][1]))
    small = [v for v in drafted if v not in labelled]
    if small:   # under the labelled nodes, which are drawn over them
        _add_small_nodes(traces, G, pos, small, small_name,
                         _node_colours(G, small, colour_by, colour_values, colour_title)[0])
    main = [v for v in drafted if v in labelled]
    if main:
        _add_draft_nodes(traces, G, pos, main, {v: t for v, t in labels.items() if v not in ringed}, frame,
                         *_node_colours(G, main, colour_by, colour_values, colour_title))
    _add_rings(traces, G, pos, rings, labels, ring_name, "#059669", RING_GROW["selected"])
    _add_rings(traces, G, pos, path_rings, labels, "accepted", ACCEPT_COLOUR, RING_GROW["accepted"])
    _add_end_token(traces, G, pos, 0, labels, "root", "#111827", dict(symbol="square", size=ROOT_SIZE, color="#111827"),
                   legend=False)
    if BONUS in pos and show_path:
        _add_end_token(traces, G, pos, BONUS, labels, "bonus token", ACCEPT_COLOUR,
                       dict(symbol="star", size=BONUS_SIZE, color=ACCEPT_COLOUR, line=dict(width=1, color="#7f1d1d")))
    return figure(traces, **_layout(lines, frame))


def scatter(**kw) -> dict:
    """A scatter trace as Plotly reads it (validated once, when the figure is made)."""
    return dict(type="scatter", **kw)


def _add_edges(traces, G, pos, nodes, colour, width, name) -> None:
    xs, ys = [], []
    for v in nodes:
        preds = list(G.predecessors(v))
        if not preds or preds[0] not in pos:
            continue
        (x0, y0), (x1, y1) = pos[preds[0]], pos[v]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    if not xs:   # an empty trace still costs the browser a layer to draw
        return
    traces.append(scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, width=width),
                          hoverinfo="skip", name=name, showlegend=False))


def _node_colours(G, main, colour_by, colour_values, colour_title) -> tuple[list, str]:
    if colour_values is not None:
        return [colour_values.get(v) or 0.0 for v in main], colour_title or "probability"
    if colour_by == "prob":
        return [G.nodes[v]["p"] for v in main], "draft prob"
    return [G.nodes[v]["pv"] for v in main], "path value"


def _add_small_nodes(traces, G, pos, nodes, name, cvals) -> None:
    """Nodes drawn small, faded and unlabelled (an expansion's candidates left in the pool): they
    keep their colour, so their values still read against the labelled nodes', but recede."""
    traces.append(scatter(
        x=[pos[v][0] for v in nodes], y=[pos[v][1] for v in nodes], mode="markers", name=name,
        customdata=[str(v) for v in nodes], hovertext=[_hover(G.nodes[v]) for v in nodes],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(size=FADED_SIZE, color=cvals, cmin=0.0, cmax=1.0, colorscale=CONFIDENCE_SCALE,
                    opacity=SMALL_OPACITY, line=dict(width=0.6, color="#475569"))))   # the palest value stays visible


def _add_draft_nodes(traces, G, pos, main, labels, frame, cvals, ctitle) -> None:
    # the colour bar lies under the depth axis, across the plot's width: beside the plot it took a
    # fifth of a phone-wide figure, and inside it covered nodes
    traces.append(scatter(
        x=[pos[v][0] for v in main], y=[pos[v][1] for v in main], mode="markers+text",
        name="draft nodes", customdata=[str(v) for v in main], showlegend=False,   # the colour bar names them
        text=[esc(labels[v][0]) if v in labels else "" for v in main],
        textposition=[labels[v][1] if v in labels else "middle right" for v in main],
        textfont=dict(size=LABEL_SIZE, color="#111827", shadow="auto"), cliponaxis=False,
        hovertext=[_hover(G.nodes[v]) for v in main], hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(size=[_size(G.nodes[v]["pv"]) for v in main], color=cvals,
                    cmin=0.0, cmax=1.0, colorscale=CONFIDENCE_SCALE,
                    line=dict(width=1, color="#334155"),
                    colorbar=dict(title=dict(text=ctitle, side="right", font=dict(size=12)), orientation="h",
                                  thickness=10, lenmode="pixels", len=130, x=0.0, xanchor="left",
                                  yref="paper", y=-AXIS_PX / frame.plot_h, yanchor="top", ypad=0,
                                  tickfont=dict(size=11), tickformat=".1f", tickvals=[0.0, 0.5, 1.0],
                                  ticklabeloverflow="allow"))))


def _add_rings(traces, G, pos, nodes, labels, name, colour, grow) -> None:
    """Open circles around nodes (selected for expansion, or accepted), `grow` px past the node,
    with the labels of those nodes."""
    if not nodes:
        return
    traces.append(scatter(
        x=[pos[v][0] for v in nodes], y=[pos[v][1] for v in nodes], mode="markers+text", name=name,
        customdata=[str(v) for v in nodes], hoverinfo="skip", cliponaxis=False,
        text=[esc(labels[v][0]) if v in labels else "" for v in nodes],
        textposition=[labels[v][1] if v in labels else "middle right" for v in nodes],
        textfont=dict(size=LABEL_SIZE, color="#111827", shadow="auto"),
        marker=dict(symbol="circle-open", size=[_size(G.nodes[v]["pv"]) + grow for v in nodes],
                    color=colour, line=dict(width=3, color=colour))))


def _add_end_token(traces, G, pos, v, labels, name, colour, marker, legend: bool = True) -> None:
    """The root or the bonus token: a bold label and its own marker."""
    text, position = labels.get(v, ("", "middle right"))
    traces.append(scatter(
        x=[pos[v][0]], y=[pos[v][1]], mode="markers+text", name=name, customdata=[str(v)],
        text=[esc(text)], textposition=position, cliponaxis=False,
        textfont=dict(size=END_SIZE, color=colour, shadow="auto", weight="bold"),
        hovertext=[_hover(G.nodes[v])], hovertemplate="%{hovertext}<extra></extra>",
        marker=marker, showlegend=legend))


def _layout(lines: list, frame: Frame) -> dict:
    """The tree's whole layout, one dict."""
    lay = base_layout(None, height=frame.height)
    if lines:
        # anchored by its first line's bottom, the lines under it run down into the margin reserved
        # for them (Plotly mis-places a multi-line title anchored at its top: the first line is cut)
        lay["title"] = dict(text=title_html(lines), x=0.01, xanchor="left", xref="container",
                            y=1.0 - 24.0 / frame.height, yanchor="bottom", yref="container",
                            pad=dict(t=0, b=0), font=dict(size=16))
    # the legend sits under the colour bar: above the plot it collided with long titles
    lay.update(margin=dict(l=MARGIN_X, r=MARGIN_X, t=frame.top, b=frame.bottom, autoexpand=False),
               hovermode="closest", dragmode="pan",
               legend=dict(orientation="h", yref="paper", yanchor="top", xanchor="left", x=0.0,
                           y=-(AXIS_PX + COLORBAR_PX) / frame.plot_h, font=dict(size=12),
                           itemwidth=30, tracegroupgap=0),
               xaxis=dict(range=[frame.x0, frame.x1], dtick=1, title=dict(text="depth", font=dict(size=12), standoff=4),
                          showgrid=True, gridcolor="#f1f5f9", zeroline=False, tickfont=dict(size=12), automargin=False),
               yaxis=dict(range=[frame.rows + 0.5, -0.5], visible=False, automargin=False))
    return lay


def tree_title(step) -> str:
    t = step.tree
    n_pool, n_kept = len(t.tokens) - 1, sum(bool(k) for k in t.kept) - 1
    acc = step.accepted_len
    plain = " (none kept: a plain step)" if n_kept == 0 else ""   # a budget judged no draft worth its cost
    return (f"Cycle {step.cycle} · {step.policy}: {n_kept} of {n_pool} drafted tokens verified{plain} · "
            f"accepted {acc} + bonus = {acc + 1} token{'s' if acc else ''}")


def tree_figure(step, colour_by: str = "value", show_dropped: bool = False, title: str | None = None,
                height: int | None = None) -> go.Figure:
    """The interactive tree of one cycle: accepted path highlighted, bonus after it, dropped pool
    nodes faded (when show_dropped). A long title (tree_title's, or the one given) is wrapped:
    a short first line, the details under it in a smaller font."""
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
    note = dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                font=dict(size=15, color="#6b7280"))
    return figure([], **base_layout(None, height=height), annotations=[note], xaxis=dict(visible=False),
                  yaxis=dict(visible=False))
