"""The page: header, model status, the three tabs; and serving it."""
from __future__ import annotations

from pathlib import Path

import gradio as gr
from fastapi.routing import APIRoute

from eagle2 import config
from eagle2.errors import UserError
from viz.tokens import TOKEN_CSS

from . import gpu_record
from .dashboard import ACCEPT, OPEN, render
from .handlers import REPLAY_SOURCE, Explain, Replay, trace_info
from .status import live_status
from .classroom import CLASSROOM, MARK_ROUTE, mark_route
from .model import MODEL
from . import session as live_sessions
from .tabs.explain import build_explain_tab
from .tabs.live import build_live_tab
from .tabs.replay import build_replay_tab
from .traces import load_view, shipped_traces

CSS = TOKEN_CSS + (Path(__file__).resolve().parent / "style.css").read_text(encoding="utf-8")
TITLE = "EAGLE-2, step by step"
HEADER = (f"<h1>{TITLE}</h1><p>Speculative decoding with a context-aware dynamic draft tree: a small draft "
          "head proposes a tree of tokens, the target model checks them all in one forward pass and keeps the "
          "longest correct path.</p>")
QUEUE_ON_ZERO_GPU = 1024   # events waiting at once on a ZeroGPU Space (elsewhere Gradio's: no bound)
THEME = dict(primary_hue="blue", neutral_hue="slate", font=["Inter", "Segoe UI", "Helvetica", "Arial", "sans-serif"])


def model_status():
    """The model line, and the timer that refreshes it (stopped once the model is loaded or failed)."""
    return MODEL.info_md(), gr.Timer(active=not (MODEL.ready or MODEL.error))


def on_page_load():
    if MODEL.warning:
        gr.Warning(MODEL.warning)
    return model_status()


def build_app(preload_trace: bool = True, device: str | None = None) -> gr.Blocks:
    """The page; its controls start at the defaults for `device` ('cpu' or 'cuda'; None: the
    device the model was started for, MODEL.options)."""
    traces = shipped_traces()
    # The default recorded trace, rendered once per process: every new page shows it at once.
    init_view, init_dash, init_info, init_ex = None, None, "", None
    init_status = live_status(None)
    if preload_trace and traces:
        try:
            init_view = load_view(next(iter(traces.values())))
            init_dash = render(init_view, panels=OPEN)   # closed sections are drawn when opened
            init_info = trace_info(init_view)
            init_ex = Explain().on_explain(REPLAY_SOURCE, None, init_view, None, None)   # keyed by name
            init_status = (f"Showing the recorded trace **{next(iter(traces))}** until you press **Step** "
                           f"(the Replay tab has more).")
        except UserError as e:
            init_info = f"Could not open the default trace: {e}"

    with gr.Blocks(title=TITLE) as demo:
        # The Live tab's session lives as long as its tab: no time_to_live (a finite one would delete
        # a presenter's race while the class watches one cycle). Gradio deletes a closed tab's state
        # an hour later; end_session then frees what it held (LivePool frees idle decoders sooner).
        sess = gr.State(None, time_to_live=None, delete_callback=end_session)
        rview = gr.State(init_view)
        with gr.Row(elem_id="header"):
            gr.HTML(HEADER)
        model_md = gr.HTML(MODEL.info_md(), elem_id="modelinfo")
        timer = gr.Timer(1.0)

        with gr.Tabs(selected="live") as tabs:
            with gr.Tab("Live", id="live"):
                live_c, _ = build_live_tab(sess, init_dash, init_status, device, init_view, page=demo)
            with gr.Tab("Replay", id="replay"):
                replay_c, replay_out = build_replay_tab(rview, traces, init_dash, init_info)
            with gr.Tab("Explain a cycle", id="explain"):
                build_explain_tab(sess, rview, init_ex)
        # "Record on the GPU" (Live) draws its trace into Replay and selects that tab
        gpu_record.wire(live_c["gpu_record"], live_c["gpu_line"], tabs, Replay(replay_out),
                        [live_c[n] for n in ("prompt", "max_new_tokens", "temperature", "top_p", "seed")]
                        + [replay_c[n] for n in ("colour_by", "show_dropped", "panels")] + [replay_out[ACCEPT]])

        timer.tick(model_status, None, [model_md, timer], show_progress="hidden")
        demo.load(on_page_load, None, [model_md, timer], show_progress="hidden")

        demo.unload(tab_closed)
    return demo


def tab_closed(request: gr.Request) -> None:
    """A tab closed (its heartbeat ended): the presentations it gives end now (their followers
    are told); its session itself stays with Gradio for an hour, in case the tab reopens."""
    CLASSROOM.tab_closed(getattr(request, "session_hash", None))


def end_session(value) -> None:
    """Gradio deleted a tab's session state: its presentation ends, its decoders are freed (a
    follower stops counting among the followers; the race it had before following is freed)."""
    if value is None:
        return
    if value.following is not None:
        CLASSROOM.leave(value.following)
    CLASSROOM.close(value.presentation, "the presenter left")
    live_sessions.pool().forget(value)


def launch(host: str | None = None, port: int | None = None, concurrency: int = 2, block: bool = True) -> gr.Blocks:
    """Build and serve the page (block=False returns at once: tests; close with demo.close()). A
    host or port left None is Gradio's choice (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as on a Space)."""
    demo = build_app()
    # Gradio's queue holds any number of waiting events, except on a ZeroGPU Space, where it holds
    # one unless told: a class's second Step would be turned away. There the page decodes on the CPU.
    demo.queue(default_concurrency_limit=max(1, concurrency),
               max_size=QUEUE_ON_ZERO_GPU if config.current().zero_gpu else None)
    # the classroom's mark route sits beside Gradio's own routes, before them (ui/classroom.py)
    classroom_routes = [APIRoute(MARK_ROUTE, mark_route, methods=["GET"], include_in_schema=False)]
    demo.launch(server_name=host, server_port=port, ssr_mode=False, show_error=True, css=CSS,
                app_kwargs={"routes": classroom_routes},
                theme=gr.themes.Soft(**THEME), footer_links=["gradio"], prevent_thread_lock=not block,
                quiet=not block)
    CLASSROOM.bind_host = demo.server_name   # a follow link's address: the LAN's when serving on 0.0.0.0
    return demo
