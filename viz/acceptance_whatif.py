"""What-if on acceptance: why each extra draft token pays less than the one before.

The chain model (speculative decoding's textbook analysis: Leviathan et al., arXiv 2211.17192). A
draft of K tokens in a chain, each accepted with chance a once the ones before it were, emits per
cycle the accepted prefix plus the target's own bonus token, on average

    E(a, K) = 1 + a + a^2 + ... + a^K = (1 - a^(K+1)) / (1 - a)        (K + 1 at a = 1)

tokens: the k-th guess adds only a^k, and no K returns more than 1 / (1 - a). The cycle costs K
draft-head calls and one target forward over K + 1 tokens, so with a price table (viz/whatif.py:
t(N) and a draft call, this machine's) the modelled speedup over plain decoding is

    S(a, K) = E(a, K) * t(1) / (K * t_draft + t(K + 1))

Measured, from a run's draft trees: for each depth d, how many cycles tried it and how many got
it accepted, counted two ways. "Top guess": a chain drafting the head's most likely token at each
depth (the rank-0 child) would have tried depth d when the top guesses at depths < d were all
accepted, and got it accepted when the accepted node at d is the top guess; under greedy and the
top-k rule (docs/algorithms.md §7) that is exactly what a chain would have done with the same
draws, so these rates are the model's a, measured (under SpecInfer's rule or a relaxed one, an
estimate). "Any guess": the tree's own acceptance by depth
(viz.charts.depth_acceptance, but only counting a depth as tried when the tree held a candidate
there): higher, because a tree offers several guesses per depth. A depth the draft never reached
is not counted as a rejection (the tree ended, nothing was refused). The measured chain returns

    E_measured(K) = 1 + sum_{k <= K} prod_{d <= k} a_d

tokens per cycle, priced with the same costs as the model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import plotly.graph_objects as go

from eagle2.model.verify_times import VerifyTimes

from .common import ROLE_COLOURS, base_layout, decode_steps, figure, one_x, text_px
from .tree_graph import empty_figure
from .whatif import PriceTable

K_MAX = 12            # the longest chain drawn (the page's depth slider stops at 12)
DEFAULT_A = 0.7       # the slider's starting value
A_RANGE = (0.05, 0.99)
MIN_TRIED = 3         # a depth tried by fewer cycles gives no measured point (one cycle says 0% or 100%)
MODEL_COLOUR = "#7c3aed"
RUN_COLOUR = ROLE_COLOURS["main"]
EMPTY = "The acceptance what-if draws once a draft tree has been verified."


# ------------------------------------------------------------------------------------ the model
def chain_tokens(a: float, k: int) -> float:
    """E(a, K): expected tokens one cycle of a K-token chain emits (module docstring)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def forwards_table() -> PriceTable:
    """The fallback when a run measured no costs: only target forwards count (t(N) = t(1), drafting
    free), so the speedup is the tokens per cycle and depth never loses; said on the figure."""
    return PriceTable(label="target forwards only (this run has no measured costs)", source="model",
                      times=VerifyTimes({1: 1.0}), draft_call_s=0.0)


def chain_cost(k: int, table: PriceTable) -> float:
    """One cycle of a K-token chain in units of t(1): K draft calls plus verifying K + 1 tokens."""
    return (k * table.draft_call_s + table.times.t(k + 1)) / table.times.t(1)


def chain_speedup(a: float, k: int, table: PriceTable) -> float:
    """S(a, K): the modelled speedup of a K-token chain over plain decoding (module docstring)."""
    return chain_tokens(a, k) / chain_cost(k, table)


def best_k(a: float, table: PriceTable, k_max: int = K_MAX) -> int:
    """The K in 1..k_max with the highest modelled speedup (ties: the shorter chain)."""
    return max(range(1, k_max + 1), key=lambda k: (chain_speedup(a, k, table), -k))


# ------------------------------------------------------------------------------------ measured
@dataclass
class DepthCounts:
    """Per depth d = 1, 2, ... (index d - 1): cycles that tried it, and that got it accepted."""
    tried: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def add(self, d: int, ok: bool) -> None:
        while len(self.tried) < d:
            self.tried.append(0)
            self.accepted.append(0)
        self.tried[d - 1] += 1
        self.accepted[d - 1] += int(ok)

    def rates(self, min_tried: int = MIN_TRIED) -> list[float]:
        """a_d for d = 1.. up to the first depth tried fewer than `min_tried` times."""
        out = []
        for n, ok in zip(self.tried, self.accepted):
            if n < max(1, min_tried):
                break
            out.append(ok / n)
        return out

    def pooled(self) -> float | None:
        """One a for the whole run: accepted / tried over every depth (None if nothing was tried)."""
        n = sum(self.tried)
        return sum(self.accepted) / n if n else None


def depth_counts(steps) -> tuple[DepthCounts, DepthCounts]:
    """(top guess, any guess) counts over the drafted steps (module docstring)."""
    top, any_ = DepthCounts(), DepthCounts()
    for st in decode_steps(steps):
        t = st.tree
        kids: dict[int, list[int]] = {}
        for j, (p, kept) in enumerate(zip(t.parents, t.kept)):
            if kept and p >= 0:
                kids.setdefault(p, []).append(j)
        path = list(st.accepted_path)
        node, chain = next((i for i, p in enumerate(t.parents) if p < 0), 0), True
        for d in range(1, len(path) + 2):
            ks = kids.get(node)
            if not ks:                          # the tree ends here: nothing was refused
                break
            got = path[d - 1] if d <= len(path) else None
            any_.add(d, got is not None)
            if chain:
                first = [j for j in ks if t.ranks[j] == 0]
                if not first:                   # the top guess was not verified: a chain is not observed
                    chain = False
                else:
                    chain = got == first[0]
                    top.add(d, chain)
            if got is None:
                break
            node = got
    return top, any_


def chain_estimate(rates: list[float]) -> list[float]:
    """E_measured(K) for K = 1..len(rates): 1 + sum_{k <= K} prod_{d <= k} a_d."""
    out, reach, total = [], 1.0, 1.0
    for a in rates:
        reach *= a
        total += reach
        out.append(total)
    return out


# ------------------------------------------------------------------------------------ figure
CAPTION_PX = 300      # caption lines fit a phone's figure (390 px screen, ~320 px figure)
CAPTION_SIZE = 12
PLOT_PX = 250         # the plot area's height, whatever the caption's


def wrap_px(text: str, px: float = CAPTION_PX, size: float = CAPTION_SIZE) -> list[str]:
    """Split a sentence at spaces into lines of at most `px` pixels at `size` px (tags not counted)."""
    lines, cur = [], ""
    for word in text.split(" "):
        cand = f"{cur} {word}" if cur else word
        if cur and text_px(re.sub(r"<[^>]+>", "", cand), size) > px:
            lines.append(cur)
            cur = word
        else:
            cur = cand
    return lines + ([cur] if cur else [])


def _costs_note(table: PriceTable) -> str:
    if table.source == "model" and table.draft_call_s == 0.0 and len(table.times) == 1:
        return "No measured costs in this run: priced in target forwards only, so a longer chain never loses."
    if table.source == "model":
        return f"Cost: K draft calls + t(K+1), priced as {table.label}."
    how = "estimated from this run" if "estimated" in table.label else "measured here"
    return (f"Cost: K draft calls ({table.draft_call_s / table.times.t(1):.2f}·t(1) each) + t(K+1), "
            f"{how}.")


def acceptance_whatif_chart(steps, table: PriceTable | None, a: float = DEFAULT_A, label: str = "this run",
                            k_max: int = K_MAX, height: int = PLOT_PX) -> go.Figure:
    """The modelled speedup of a K-token chain for K = 1..k_max at acceptance `a` (the slider), the
    model at this run's measured a, and this run's measured points (its head's top guesses by
    depth), all priced with `table` (this machine's, viz.whatif.price_table_from_trace; None: target
    forwards only, said on the figure). `steps`: the run's StepTraces; `label`: its decoder;
    `height`: the plot area's (the caption and legend add theirs)."""
    if not decode_steps(steps or []):
        return empty_figure(EMPTY, height + 80)
    a = min(1.0, max(0.0, float(a)))
    table = table or forwards_table()
    ks = list(range(1, k_max + 1))
    top, any_ = depth_counts(steps)
    traces = []

    def model_trace(av: float, name: str, dash: str, colour: str, width: float) -> list[float]:
        ys = [chain_speedup(av, k, table) for k in ks]
        info = [[chain_tokens(av, k), av ** k, chain_cost(k, table)] for k in ks]
        traces.append(dict(
            type="scatter", x=ks, y=ys, mode="lines", name=name, line=dict(color=colour, dash=dash, width=width),
            customdata=info,
            hovertemplate=(f"<b>model, a = {av:.2f}</b>, K = %{{x}}<br>%{{customdata[0]:.2f}} tokens a cycle "
                           "(guess K adds %{customdata[1]:.2f})<br>a cycle costs %{customdata[2]:.2f}·t(1)"
                           " → %{y:.2f}× plain<extra></extra>")))
        return ys

    ys_all = list(model_trace(a, f"model, a = {a:.2f} (slider)", "solid", MODEL_COLOUR, 3.5))
    run_a, rates = top.pooled(), top.rates()
    if run_a is not None:
        ys_all += model_trace(run_a, f"model, this run's a = {run_a:.2f}", "dot", RUN_COLOUR, 2.5)
    meas = chain_estimate(rates)[:k_max]
    if meas:
        mk = ks[:len(meas)]
        my = [e / chain_cost(k, table) for k, e in zip(mk, meas)]
        info = [[rates[k - 1], top.accepted[k - 1], top.tried[k - 1], e] for k, e in zip(mk, meas)]
        traces.append(dict(
            type="scatter", x=mk, y=my, mode="markers", name="measured, this run", customdata=info,
            marker=dict(size=13, color=RUN_COLOUR, line=dict(color="white", width=2)),
            hovertemplate=(f"<b>measured, this run</b> ({label}), K = %{{x}}<br>its top guess at depth %{{x}} "
                           "was accepted %{customdata[1]} of %{customdata[2]} times (%{customdata[0]:.0%})<br>"
                           "a chain with these rates: %{customdata[3]:.2f} tokens a cycle → %{y:.2f}× plain"
                           "<extra></extra>")))
        ys_all += my
    kb = best_k(a, table, k_max)
    sb = chain_speedup(a, kb, table)
    traces.append(dict(
        type="scatter", x=[kb], y=[sb], mode="markers", name=f"best K at a = {a:.2f}: {kb}",   # in the legend: a label
        marker=dict(symbol="star", size=20, color=MODEL_COLOUR, line=dict(color="white", width=1)),  # would hide dots
        cliponaxis=False, hovertemplate=f"best K at a = {a:.2f}: {kb}, {sb:.2f}× plain<extra></extra>"))

    # the caption, read aloud: the model, its lesson, the prices, then what this run measured
    cap = f": at most {1 / (1 - a):.1f} tokens, however long the chain" if a < 1 else ""
    notes = ["<b>Model:</b> K guesses, each accepted with chance a, give (1 − a<sup>K+1</sup>) / (1 − a) "
             "tokens a cycle.",
             f"At a = {a:.2f} guess 1 adds {a:.2f} tokens, guess 5 only {a ** 5:.2f}{cap}.",
             _costs_note(table)]
    if run_a is not None:
        notes.append(f"<b>Measured</b> ({label}): its top guess was accepted {sum(top.accepted)} of "
                     f"{sum(top.tried)} times (a = {run_a:.2f})."
                     + ("" if meas else f" Dots once a depth has been tried {MIN_TRIED} times."))
        tree_a = any_.pooled()
        if tree_a is not None and tree_a > run_a + 0.005:
            notes.append(f"Its trees, with more guesses a depth, got {tree_a:.2f}: like a better head.")
    else:
        notes.append("This run never verified its head's top guess: no measured points.")
    lines = [ln for n in notes for ln in wrap_px(n)]
    # the caption above; below, the axis title and the legend (one or two rows wide, four on a phone)
    top_px, bottom_px = 56 + 16 * len(lines), 150
    lay = base_layout("Why each extra draft token pays less", height=height + top_px + bottom_px)
    lay["title"].update(y=1, yref="container", yanchor="top", pad=dict(t=12))
    lay["margin"] = dict(l=52, r=16, t=top_px, b=bottom_px)
    lay["legend"] = dict(orientation="h", y=-66 / height, yanchor="top", xanchor="left", x=0, font=dict(size=13))
    caption = dict(text="<br>".join(lines), xref="paper", yref="paper", x=0, y=1, xanchor="left",
                   yanchor="bottom", xshift=-40, yshift=8, align="left", showarrow=False,
                   font=dict(size=CAPTION_SIZE, color="#374151"))
    return figure(traces, **lay, showlegend=True, annotations=[caption], shapes=[one_x()],
                  xaxis=dict(title=dict(text="K: draft tokens in the chain"), dtick=1, range=[0.5, k_max + 0.5]),
                  yaxis=dict(title=dict(text="speedup over plain"), range=[0, 1.18 * max(ys_all + [1.0])],
                             ticksuffix="×"))
