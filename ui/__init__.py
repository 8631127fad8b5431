"""The Gradio page, in parts.

    model.py      the model, loaded once per process in a background thread (MODEL)
    session.py    a browser session: holds the engine's lockstep race; Stop, view, export, LivePool
    view.py       what a dashboard shows: a live session or a recorded trace
    dashboard.py  the dashboard's components and their rendering, keyed by output name
    handlers.py   the event handlers, one object per tab, returning {component: value}
    help.py       the controls' help texts (the policies' from the engine's registry)
    traces.py     shipped traces and example prompts; recording the traces
    tabs/         one builder per tab: live.py, replay.py, explain.py
    page.py       the page (header, model info, tabs), launch()
    style.css     the page's CSS (viz.tokens.TOKEN_CSS is prepended)
    screenshot.py refreshes docs/screenshot.png in a real browser

model, session, view and traces import no Gradio (torch's threads: eagle2/threads.py).
"""
