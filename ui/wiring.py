"""Binding handlers that return {output name: value} to Gradio events, whose outputs are lists.

The one place where output names become component positions: `on(event, handler, inputs,
names, components)` passes Gradio the components in the order of `names` and turns each dict
the handler returns (or yields) into a list in that same order.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence


def ordered(out: dict, names: Sequence[str]) -> list:
    """A handler's named outputs as a list in the order of `names` (every name, no other)."""
    if set(out) != set(names):
        raise KeyError(f"handler outputs {sorted(out)} do not match {sorted(names)}")
    return [out[n] for n in names]


def positional(handler: Callable, names: Sequence[str]) -> Callable:
    """`handler` returning lists in the order of `names` (a generator stays a generator: Gradio
    streams it); it keeps the handler's name, so the API's endpoint names stay the same."""
    names = tuple(names)
    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def stream(*args):
            for out in handler(*args):
                yield ordered(out, names)
        return stream

    @functools.wraps(handler)
    def call(*args):
        return ordered(handler(*args), names)
    return call


def on(event: Callable, handler: Callable, inputs, names: Sequence[str], components: dict, **kw):
    """Subscribe `handler` to `event` (e.g. button.click) with the components named `names` as
    outputs."""
    return event(positional(handler, names), inputs, [components[n] for n in names], **kw)
