"""The Live tab: a prompt, the tree and generation settings, Step / Run / Stop / Reset, and the
dashboard of the three decoders racing in lockstep."""
from __future__ import annotations

import gradio as gr

from eagle2.policies.registry import names as policy_names

from .. import handlers as h
from ..outputs import CONTROLS, FOLLOW, LIVE, PANELS_STATE, PRESENT, RUN, TICK
from ..classroom import MARK_ROUTE, OFF
from ..dashboard import ACCEPT, DASH, OPEN, build_dashboard
from ..gpu_record import where as gpu_where
from ..help import HELP, policy_help, preset_label, presets_help
from ..session import defaults, device_kind
from ..traces import load_examples
from ..view import View
from .sections import wire_sections

COLOUR_CHOICES = ["path value", "draft prob"]
RUN_TICK_S = 0.1      # a Run's next Step is queued this soon after the last one answered
FOLLOW_TICK_S = 1.0   # how often a follower asks for the presenter's latest cycle
# The follow timer's tick, in the browser (inputs and outputs: the follow mark, the poke). A tab
# that follows ("CODE:VERSION") asks the classroom's mark route: a few bytes from memory, no Gradio
# event, so a class costs the presenter next to nothing; a new mark brings the frame (the mark's
# change event). OFF and an ended presentation ask nothing. Anything else (just followed, or
# presenting: the followers' count) pokes the page's follow_tick event. The mark route is at the
# app's root (Gradio's `root`, behind a proxy's path too); a failed or slow answer changes nothing.
FOLLOW_TICK_JS = r"""
async (mark, poke) => {
  const m = /^([A-Z0-9]{6}):[0-9]+$/.exec(mark || "");
  if (!m) {
    return (mark === "%(off)s" || /:ended$/.test(mark || "")) ? [mark, poke] : [mark, String(Number(poke || 0) + 1)];
  }
  try {
    const root = ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\/$/, "");
    const q = new URLSearchParams({code: m[1], tab: window.__gradio_session_hash__ || ""});
    const r = await fetch(root + "%(route)s?" + q, {cache: "no-store", signal: AbortSignal.timeout(5000)});
    if (r.ok) { return [(await r.json()).mark || mark, poke]; }
  } catch (e) {}
  return [mark, poke];
}
""" % {"off": OFF, "route": MARK_ROUTE}
PRESETS = (("cpu", "CPU"), ("cuda", "GPU"))   # the tree presets: each device kind's defaults
TREE = ("policy", "compare", "total_tokens", "depth", "top_k")   # the controls a preset sets


def preset_values(kind: str):
    """A click handler: the tree controls' values of `kind`'s defaults, in the order of TREE."""
    def values() -> list:
        s = defaults(kind)
        return [getattr(s, n) for n in TREE]
    return values


def example_map(examples: dict[str, list[str]]) -> dict[str, str]:
    """The example picker's choices ("category · prompt"), each with the prompt it fills in."""
    return {f"{cat} · {p}": p for cat, ps in examples.items() for p in ps}


def first_example(ex_map: dict[str, str]) -> str:
    """The prompt a new page starts with: the first example prompt (assets/prompts/examples.json),
    or none."""
    return next(iter(ex_map.values()), "")


def build_prompt(c: dict, choices: list[str], value: str = "") -> None:
    """The prompt box, holding `value` (a first visitor can press Step at once), and the example
    picker, into `c`."""
    c["prompt"] = gr.Textbox(value, label="Prompt (chat message)", lines=4, elem_id="prompt",
                             placeholder="Ask the model something…")
    c["example"] = gr.Dropdown(choices=choices, value=None, label="Example prompts", elem_id="examples",
                               info=HELP["examples"])


def build_buttons(c: dict) -> None:
    """Step / Run / Stop / Reset in one row, into `c`."""
    with gr.Row(elem_classes=["controls", "step-bar"], elem_id="live-buttons"):
        c["step"] = gr.Button("Step", variant="primary", elem_id="step-btn", min_width=70)
        c["run"] = gr.Button("Run", variant="secondary", elem_id="run-btn", min_width=70)
        c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=70)
        c["reset"] = gr.Button("Reset", elem_id="reset-btn", min_width=70)


def build_gpu_record(c: dict) -> None:
    """"Record on the GPU" and the line beside it (where a record would run, then how the last one
    went), into `c`; page.py wires it to the Replay tab (ui/gpu_record.py)."""
    with gr.Column(elem_id="gpu-record", elem_classes=["side-gpu"]):
        with gr.Row(elem_classes=["controls"]):
            c["gpu_record"] = gr.Button("Record on the GPU", elem_id="gpu-record-btn", size="sm", min_width=140)
        c["gpu_line"] = gr.Markdown(gpu_where(), elem_id="gpu-line")


def build_classroom(c: dict) -> None:
    """Present (a code and a follow link, large enough for a projector) and Follow, into `c`."""
    with gr.Row(elem_classes=["controls"]):
        c["present"] = gr.Button("Present to a class", variant="primary", elem_id="present-btn", min_width=120)
        c["unpresent"] = gr.Button("Stop presenting", elem_id="unpresent-btn", min_width=120)
    c["follow_code"] = gr.Textbox("", label="Follow code", interactive=False, elem_id="follow-code",
                                  placeholder="(press Present)", info=HELP["follow_code"])
    c["follow_link"] = gr.HTML("", elem_id="follow-link")
    with gr.Row(equal_height=False, elem_classes=["controls"]):
        c["follow_input"] = gr.Textbox("", label="Follow a presenter", placeholder="code, e.g. K7P2QX",
                                       elem_id="follow-input", scale=3, max_lines=1)
        c["follow"] = gr.Button("Follow", elem_id="follow-btn", scale=1, min_width=80)


def build_settings(c: dict, kind: str) -> None:
    """The tree, generation and display settings and the downloads, into `c`, at `kind`'s defaults."""
    d, pols = defaults(kind), policy_names()
    with gr.Accordion("Tree settings", open=True):
        with gr.Row():   # each device kind's defaults, one click away
            for k, who in PRESETS:
                mark = " (this machine)" if k == kind else ""
                c[f"preset_{k}"] = gr.Button(f"{who} default{mark}: {preset_label(defaults(k))}",
                                             size="sm", elem_id=f"preset-{k}", min_width=150)
        c["presets_help"] = gr.HTML(f'<p style="font-size:var(--block-info-text-size);color:'
                                    f'var(--block-info-text-color);margin:0 2px">{presets_help(kind)}</p>',
                                    elem_id="presets-help")
        c["policy"] = gr.Dropdown(pols, value=d.policy, label="Tree policy", info=policy_help(), elem_id="policy")
        c["compare"] = gr.Dropdown(pols, value=d.compare, label="Compare with", info=HELP["compare"],
                                   elem_id="compare")
        c["total_tokens"] = gr.Slider(2, 256, value=d.total_tokens, step=1, label="Total tokens N",
                                      info=HELP["total_tokens"])
        c["depth"] = gr.Slider(1, 12, value=d.depth, step=1, label="Depth d", info=HELP["depth"])
        c["top_k"] = gr.Slider(1, 20, value=d.top_k, step=1, label="Top-k", info=HELP["top_k"])
    with gr.Accordion("Generation settings", open=False):
        c["temperature"] = gr.Slider(0, 2, value=d.temperature, step=0.05, label="Temperature",
                                     info=HELP["temperature"])
        c["top_p"] = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="Top-p", info=HELP["top_p"])
        c["seed"] = gr.Number(d.seed, precision=0, label="Seed", info=HELP["seed"])
        c["max_new_tokens"] = gr.Slider(1, 512, value=d.max_new_tokens, step=1, label="Max new tokens",
                                        info=HELP["max_new_tokens"])
    with gr.Accordion("Display", open=True):
        c["side_by_side"] = gr.Checkbox(d.side_by_side, label="Draw the comparison policy's tree on the same context",
                                        info=HELP["side_by_side"], elem_id="side-by-side")
        c["colour_by"] = gr.Radio(COLOUR_CHOICES, value=COLOUR_CHOICES[0], label="Colour nodes by",
                                  info=HELP["colour_by"])
        c["show_dropped"] = gr.Checkbox(False, label="Show nodes dropped by the rerank (faded)", elem_id="show-dropped")
    with gr.Accordion("Downloads", open=False, elem_id="live-downloads"):
        c["export"] = gr.Button("Export trace (JSON), table (CSV), tree (HTML)", elem_id="live-export")
        c["files"] = gr.File(file_count="multiple", label="Files", interactive=False, elem_id="live-files")


def build_live_tab(sess: gr.State, init_dash: dict | None, init_status: str, device: str | None = None,
                   init_view: View | None = None, page: gr.Blocks | None = None) -> tuple[dict, dict]:
    """The tab's contents (call inside `with gr.Tab(...)`), its controls at the defaults for
    `device` (None: the device the page's model was started for), its dashboard showing
    `init_dash`, drawn from `init_view`, until the first Step; `page` (the Blocks it is in): a
    page opened at /?follow=CODE follows that presentation. Returns its controls and its outputs
    (LIVE: the session, the status line and the dashboard; the open panels, the timers, the
    classroom's code and link, the prompt), each keyed by name."""
    ex_map = example_map(load_examples())
    kind = device_kind(device)
    c: dict = {}
    c["panels"] = gr.State(OPEN if defaults(kind).side_by_side else OPEN - {"compare"})
    # Run's cycles, one queued Step per tick; a follower's poll (a presenter's count of followers)
    c["run_timer"] = gr.Timer(RUN_TICK_S, active=False)
    c["follow_timer"] = gr.Timer(FOLLOW_TICK_S, active=False)
    # classroom_events.follow_mark: its change brings a follower the new frame. Textboxes kept off
    # screen by style.css, not gr.States: a State's change does not fire after a call that bypassed
    # the queue. The poke: its change asks the page's follow_tick event (FOLLOW_TICK_JS).
    c["follow_mark"] = gr.Textbox("", elem_id="follow-mark", elem_classes=["offscreen"], show_label=False,
                                  container=False, interactive=False)
    c["follow_poke"] = gr.Textbox("0", elem_id="follow-poke", elem_classes=["offscreen"], show_label=False,
                                  container=False, interactive=False)
    # At phone width (style.css) the two columns become one: the buttons stick to the top, the tree
    # comes first, and the prompt and the settings follow it, each collapsible there.
    with gr.Row(equal_height=False, elem_id="live-layout", elem_classes=["tree-first"]):
        with gr.Column(scale=1, min_width=340, elem_classes=["side"]):
            with gr.Accordion("Prompt", open=True, elem_id="live-prompt-box",
                              elem_classes=["side-prompt", "narrow-collapsible"]):
                build_prompt(c, list(ex_map), first_example(ex_map))
            build_buttons(c)
            build_gpu_record(c)
            with gr.Accordion("Classroom: present or follow", open=False, elem_id="live-classroom",
                              elem_classes=["side-classroom"]):
                build_classroom(c)
            with gr.Accordion("Settings", open=True, elem_id="live-settings",
                              elem_classes=["side-settings", "narrow-collapsible"]):
                build_settings(c, kind)
        with gr.Column(scale=4, elem_classes=["main"]):
            status = gr.Markdown(init_status, elem_id="live-status", elem_classes=["banner", "dash-status"])
            dash, sections = build_dashboard("live", init_dash, c["panels"].value)
    out = {"session": sess, "status": status, PANELS_STATE: c["panels"], **dash,
           **{n: c[n] for n in ("run_timer", "follow_timer", "follow_mark", "follow_code", "follow_link", "prompt")}}
    live = h.Live(out, lambda s: h.live_view(s, init_view))
    wire(c, live, sections, ex_map)
    if page is not None:
        page.load(live.on_open, [sess, c["panels"]], live.outputs(FOLLOW), show_progress="hidden",
                  api_visibility="private")
    return c, out


def wire(c: dict, live: h.Live, sections: dict, ex_map: dict[str, str]) -> None:
    """The tab's events: `c` its controls, `live` its handlers (made with its outputs and the View
    its dashboard shows), `sections` the dashboard's."""
    out = live.out
    sess, panels, dash = out["session"], out[PANELS_STATE], {n: out[n] for n in DASH}
    # only the status line shows that a step is under way: a spinner over every output costs the
    # browser more than the step's own drawing. Its tracker text says where a waiting step stands
    # ("queue: 2/3 | 4.1s": the decode slots are shared by every visitor) and how long a running
    # one has taken; style.css keeps that text readable on the one-line status.
    busy = dict(concurrency_id="decode", show_progress_on=out["status"])
    controls = [sess, c["prompt"]] + [c[n] for n in CONTROLS] + [panels, out[ACCEPT]]
    outputs = live.outputs(LIVE)
    c["step"].click(live.on_step, controls, outputs, api_name="step", **busy)
    c["prompt"].submit(live.on_step, controls, outputs, api_visibility="private", **busy)
    # Run: one Step now, then one queued Step per tick of the run timer (never a slot held for a
    # whole answer: other visitors' Steps and Runs take turns with it)
    run_outputs = live.outputs(RUN)
    c["run"].click(live.on_run, controls, run_outputs, api_name="run", **busy)
    c["run_timer"].tick(live.on_run_tick, controls, run_outputs, api_name="run_next", **busy)
    c["stop"].click(h.on_stop, [sess], None, queue=False, show_progress="hidden")
    # Classroom: the followers never wait behind a decode. Their tabs poll the mark route each
    # second (FOLLOW_TICK_JS: no Gradio event); their events bypass the queue (one HTTP request
    # each, no event stream), and a tick that finds nothing new returns two plain values, no
    # component update: through the queue a poll cost the server ~30 ms of Python under the GIL,
    # and 40 followers made the presenter's Step 10x slower (benchmarks/classroom-follow/).
    present = live.outputs(PRESENT)
    c["present"].click(live.on_present, [sess], present, api_name="present", show_progress="hidden")
    c["unpresent"].click(live.on_unpresent, [sess], present, api_name="unpresent", show_progress="hidden")
    follow = live.outputs(FOLLOW)
    lane = dict(queue=False, show_progress="hidden")
    c["follow"].click(live.on_follow, [sess, c["follow_input"], panels], follow, api_name="follow", **lane)
    c["follow_input"].submit(live.on_follow, [sess, c["follow_input"], panels], follow, api_visibility="private",
                             **lane)
    mark = [c["follow_mark"], c["follow_poke"]]
    c["follow_timer"].tick(None, mark, mark, js=FOLLOW_TICK_JS, **lane)
    c["follow_poke"].change(live.on_follow_tick, [sess], live.outputs(TICK), api_name="follow_tick", **lane)
    c["follow_mark"].change(live.on_follow_frame, [sess, panels], follow, api_name="follow_frame", **lane)
    for pressed in (c["follow"].click, c["follow_input"].submit, c["present"].click):
        pressed(None, None, [c["follow_mark"]], js="() => ''", **lane)   # the next tick asks where the tab stands
    c["reset"].click(live.on_reset, [sess, panels], outputs, api_name="reset", show_progress_on=out["status"])
    c["example"].change(lambda choice: h.pick_example(choice, ex_map), [c["example"]], [c["prompt"]])
    view = [sess, dash["cycle"], c["colour_by"], c["show_dropped"], panels]
    for event in (dash["cycle"].input, c["colour_by"].change, c["show_dropped"].change):
        event(live.on_live_view, view + [out[ACCEPT]], live.outputs(DASH), trigger_mode="always_last",
              show_progress="hidden")
    c["side_by_side"].change(live.side_by_side, [sess, c["side_by_side"], *view[1:]],
                             live.outputs((PANELS_STATE, "compare")), show_progress="hidden",
                             api_visibility="private")
    wire_sections(sections, view, live)
    c["export"].click(h.on_export_live, [sess], [c["files"]], api_name="export")
    for k, _ in PRESETS:
        c[f"preset_{k}"].click(preset_values(k), None, [c[n] for n in TREE], queue=False, show_progress="hidden")
