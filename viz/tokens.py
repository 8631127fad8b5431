"""The generated text as HTML: every token coloured by the cycle that produced it, bonus tokens
marked, the cycle in each token's tooltip (title) and data attributes."""
from __future__ import annotations

import html

from .common import CYCLE_BACKGROUNDS, esc


def token_roles(step) -> list[str]:
    """Role of each token a step emitted: 'prefill' (the target's first token), 'target' (plain
    decoding), 'accepted' (a draft token the target accepted) or 'bonus'."""
    n = len(step.new_tokens)
    if step.cycle == 0:
        return ["prefill"] * n
    if step.tree is None:
        return ["target"] * n
    roles = ["accepted"] * min(n, step.accepted_len)
    if n > step.accepted_len:  # the bonus is last unless EOS / the limit cut the cycle short
        roles.append("bonus")
    return roles[:n]


_TIPS = {"prefill": "first token, from the prompt's prefill", "target": "sampled by the target",
         "accepted": "draft token accepted by the target", "bonus": "bonus token from the target"}


def token_stream_html(steps, upto: int | None = None, highlight: int | None = None,
                      empty: str = "Generated text appears here, one coloured chunk per cycle.") -> str:
    """HTML of the tokens emitted by steps[:upto] (all when None). `highlight` outlines one cycle."""
    steps = list(steps)[: upto if upto is not None else None]
    spans = []
    for s in steps:
        bg = CYCLE_BACKGROUNDS[s.cycle % len(CYCLE_BACKGROUNDS)]
        texts = list(s.new_texts) or [f"<{t}>" for t in s.new_tokens]
        for j, (text, role) in enumerate(zip(texts, token_roles(s))):
            tip = f"cycle {s.cycle} · {_TIPS[role]}"
            if role == "accepted":
                tip += f" (depth {j + 1})"
            body = esc(text).replace("\n", '<span class="nl">↵</span><br>')
            if body == "":
                body = '<span class="nl">∅</span>'
            cls = "tok" + (" bonus" if role == "bonus" else "")
            cls += " hl" if highlight is not None and s.cycle == highlight else ""
            spans.append(f'<span class="{cls}" data-cycle="{s.cycle}" data-role="{role}" '
                         f'style="background:{bg}" title="{html.escape(tip, quote=True)}">{body}</span>')
    if not spans:
        return f'<div class="tokstream empty">{esc(empty)}</div>'
    legend = ('<div class="toklegend">colour = cycle · <span class="lbonus">underlined</span> = bonus token '
              'from the target · hover a token for its cycle</div>')
    return f'<div class="tokstream">{"".join(spans)}</div>{legend}'


TOKEN_CSS = """
.tokstream { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 16px; line-height: 1.9;
  white-space: pre-wrap; word-break: break-word; padding: 10px 12px; border: 1px solid #e5e7eb;
  border-radius: 8px; background: #fff; color: #111827; min-height: 64px; max-height: 260px; overflow-y: auto; }
.tokstream.empty { color: #6b7280; font-family: inherit; font-size: 15px; }
.tokstream .tok { border-radius: 3px; padding: 1px 0; margin: 0 1px 0 0; cursor: default; }
.tokstream .tok.bonus { text-decoration: underline; text-decoration-color: #e11d48;
  text-decoration-thickness: 3px; text-underline-offset: 4px; }
.tokstream .tok.hl { outline: 2px solid #111827; }
.tokstream .nl { color: #9ca3af; }
.toklegend { font-size: 13px; color: #6b7280; margin-top: 4px; }
.toklegend .lbonus { background: #e5e7eb; text-decoration: underline; text-decoration-color: #e11d48;
  text-decoration-thickness: 3px; padding: 0 4px; border-radius: 3px; }
"""
