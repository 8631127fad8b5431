"""Binding a handler that returns {output name: value} to a Gradio event.

Gradio updates the components a handler's returned dict is keyed by (and leaves any other output
as it was), so the only step left is swapping each name for its component; the handlers stay plain
functions keyed by names, which the tests call without a page.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence


def on(event: Callable, handler: Callable, inputs, names: Sequence[str], components: dict, **kw):
    """Subscribe `handler` to `event` (e.g. button.click) with the components named `names` as
    outputs. A generator handler stays one (Gradio streams it); the handler's name is kept, so the
    API's endpoint names stay the same."""
    outputs = {n: components[n] for n in names}

    def keyed(out: dict) -> dict:
        return {outputs[n]: v for n, v in out.items()}  # a name that is not an output: KeyError

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def bound(*args):
            for out in handler(*args):
                yield keyed(out)
    else:
        @functools.wraps(handler)
        def bound(*args):
            return keyed(handler(*args))
    return event(bound, inputs, list(outputs.values()), **kw)
