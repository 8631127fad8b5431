"""Checking parsed JSON against the dataclasses of a trace, field by field, before building them.

`checked(cls, d, where)` makes sure `d` is an object holding every field of `cls` that has no
default, no name `cls` does not have, and values of the types the fields are annotated with: int,
float (an int will do), str, bool, `X | None`, lists and dicts of those (`list` or `dict` alone:
any list or object). The first problem raises a FieldError naming where it is, e.g.
"steps[3].tree.parents[5]: expected int, got str". Torch-free, like the trace types.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from ..errors import UserError


class FieldError(UserError):
    """A value that is missing, unknown or of the wrong type; the message starts with its path."""


def type_name(v) -> str:
    return "None" if v is None else type(v).__name__


def describe(tp) -> str:
    """An annotation as the message names it: int, float or None, list of int..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if tp is type(None):
        return "None"
    if origin is list and args:
        return f"list of {describe(args[0])}"
    if origin is dict and len(args) == 2:
        return f"dict of {describe(args[1])}"
    return getattr(origin or tp, "__name__", str(tp))


def _fits(v, tp) -> bool:
    """Whether v is of the plain type tp (containers: their own type only)."""
    if tp is Any:
        return True
    if tp is type(None):
        return v is None
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp in (str, list, dict):
        return isinstance(v, tp)
    raise TypeError(f"schema: cannot check values of type {tp!r}")


_EXACT = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}   # JSON's types, for the fast path


def key_path(where: str, key) -> str:
    return f"{where}.{key}" if isinstance(key, str) and key.isidentifier() else f"{where}[{key!r}]"


def check_value(v, tp, where: str) -> None:
    """Raise a FieldError unless v is of the annotated type tp (see the module docstring)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return
        fit = next((a for a in args if a is not type(None) and _fits(v, typing.get_origin(a) or a)), None)
        if fit is None:
            raise FieldError(f"{where}: expected {describe(tp)}, got {type_name(v)}")
        return check_value(v, fit, where)
    if origin is list or tp is list:
        if not isinstance(v, list):
            raise FieldError(f"{where}: expected {describe(tp)}, got {type_name(v)}")
        if args:
            exact = _EXACT.get(args[0])
            if exact is not None and all(type(x) in exact for x in v):
                return   # the common case, at a fraction of the cost of the walk that names the culprit
            for i, x in enumerate(v):
                check_value(x, args[0], f"{where}[{i}]")
        return
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            raise FieldError(f"{where}: expected {describe(tp)}, got {type_name(v)}")
        if args:
            for k, x in v.items():
                check_value(k, args[0], f"{where} (a key)")
                check_value(x, args[1], key_path(where, k))
        return
    if not _fits(v, tp):
        raise FieldError(f"{where}: expected {describe(tp)}, got {type_name(v)}")


def require_keys(d: dict, keys, where: str) -> None:
    """Raise a FieldError unless the dict d holds every one of `keys`."""
    for k in keys:
        if k not in d:
            raise FieldError(f"{where}: missing key {k!r}")


def checked(cls, d, where: str, skip=()) -> dict:
    """A copy of d, checked against the dataclass cls: every field without a default present, no
    unknown name (fields whose metadata says "runtime" are never read from files), each value of
    its field's annotated type. Fields named in `skip` are only checked for presence: the caller
    builds them (a nested dataclass)."""
    if not isinstance(d, dict):
        raise FieldError(f"{where}: expected dict, got {type_name(d)}")
    fs, hints = _fields(cls)
    for k in d:
        if k not in fs:
            raise FieldError(f"{where}: unknown field {k!r}")
    for name, f in fs.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FieldError(f"{where}: missing field {name!r}")
            continue
        if name not in skip:
            check_value(d[name], hints[name], key_path(where, name))
    return dict(d)


@functools.cache
def _fields(cls) -> tuple[dict, dict]:
    """cls's fields read from files, by name, and their annotations resolved."""
    return ({f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("runtime")},
            typing.get_type_hints(cls))
