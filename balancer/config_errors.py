"""Configuration errors that name the line: ``balancer.toml:12: …``.

``tomllib`` keeps no positions, so once validation has failed this module
finds where: :func:`culprit` narrows the error down to a key path (which
key or table makes the same validation fail on its own), and
:func:`rustext.tomllines.key_lines` (the line index of a TOML file, shared
with juggler's configuration) turns that path into a line number. Neither
runs on a valid file; both are best effort: a path they cannot place names
the nearest enclosing table, or no line at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rustext.tomllines import Path, key_lines, line_of

__all__ = ["culprit", "key_lines", "line_of"]


def _words(message: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))


def culprit(data: dict[str, Any], message: str, validate: Callable[[dict[str, Any]], object],
            error: type[Exception]) -> Path:
    """The key path responsible for ``message``, which ``validate(data)``
    raised (as ``error``): each part of the document is validated alone,
    next to the same ``listen``, and the part that fails is narrowed down;
    within a table, the key the message names."""
    def fails(doc: dict[str, Any]) -> str | None:
        try:
            validate(doc)
        except error as exc:
            return str(exc)
        except Exception:  # noqa: BLE001  # a shape validate() did not expect: a failure too
            return "?"
        return None

    if not isinstance(data, dict):
        return ()
    m = re.match(r"unknown top-level key\(s\): ([^,\s]+)", message)
    if m:
        return (m.group(1),)
    if "listen" not in data:
        return ()
    base = {"listen": data["listen"]}
    if fails(base):
        return ("listen",)
    for key, value in data.items():
        if key == "listen" or not fails({**base, key: value}):
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                if fails({**base, key: [item]}):
                    return (key, i, *_within(item, message, lambda t, k=key: fails({**base, k: [t]})))
            # fails only together (a duplicate): the last element the message names
            named = [i for i, item in enumerate(value) if _mentions(item, message)]
            return (key, named[-1]) if named else (key,)
        if isinstance(value, dict):
            sub = _within(value, message, lambda t, k=key: fails({**base, k: t}))
            if sub and isinstance(value.get(sub[0]), list):
                for i, item in enumerate(value[sub[0]]):
                    if fails({**base, key: {**value, sub[0]: [item]}}):
                        return (key, sub[0], i, *_within(item, message, lambda t, k=key, v=value, s=sub[0]: fails(
                            {**base, k: {**v, s: [t]}})))
            return (key, *sub)
        return (key,)
    # no part fails alone (a rule between keys): the first top-level key the message names
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if word in data and word != "listen":
            return (word,)
    return ()


def _mentions(item: Any, message: str) -> bool:
    if isinstance(item, str):
        return item in message
    if isinstance(item, dict):
        return any(isinstance(v, str) and v in message for v in item.values())
    return False


def _within(table: Any, message: str, fails: Callable[[dict[str, Any]], str | None]) -> Path:
    """The key of ``table`` that ``message`` is about: an unknown key it
    lists, else the key it names; of several named, the one that fails
    without the others (``fails(table)`` validates a variant of the table)."""
    if not isinstance(table, dict):
        return ()
    m = re.search(r"unknown key\(s\) in \[[^\]]*\]: ([^,\s]+)", message)
    if m and m.group(1) in table:
        return (m.group(1),)
    words = _words(message)
    named = [k for k in table if k in words]
    if not named:
        return ()
    if len(named) > 1:
        for k in named:
            if fails({kk: v for kk, v in table.items() if kk not in named or kk == k}):
                return (k,)
    return (min(named, key=lambda k: message.find(k)),)
