"""Config values checked against the types of their dataclass fields, for
every configuration the suite reads from users (TOML files, ``--set``).

A value of the wrong type gets one line naming the option and what was
expected (``server.read_limit: expected an integer, got 'abc'``) instead of
whatever the first comparison inside ``__post_init__`` would raise. Ints are
taken where floats are expected; lists where tuples are; nothing else is
converted.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["check_fields"]

_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(tp: Any) -> str:
    if tp in _EXPECTED:
        return _EXPECTED[tp]
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = _describe(args[0]) if args else "values"
        return f"a list of {inner.removeprefix('an ').removeprefix('a ')}s" if args else "a list"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: Any) -> tuple[bool, Any]:
    """(ok, value converted) for ``value`` against the annotation ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return True, None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            ok, out = _coerce(arg, value)
            if ok:
                return True, out
        return False, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if origin in (tuple, list):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return False, value
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        items = []
        for item in value:
            ok, out = _coerce(args[0], item) if args else (True, item)
            if not ok:
                return False, value
            items.append(out)
        return True, origin(items)
    return True, value  # Any, nested configs, mappings: checked by the class itself


def check_fields(cls: type, values: Mapping[str, Any], section: str) -> dict[str, Any]:
    """``values`` for ``cls(**values)``, each checked against its field's
    type; ValueError ``section.key: expected …, got …`` on the first bad one.
    Unknown keys are left for the caller to refuse."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    out = dict(values)
    for key, value in values.items():
        if key not in names or key not in hints:
            continue
        ok, converted = _coerce(hints[key], value)
        if not ok:
            where = f"{section}.{key}" if section else key
            raise ValueError(f"{where}: expected {_describe_union(hints[key])}, got {value!r}")
        out[key] = converted
    return out


def _describe_union(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    return _describe(tp)
