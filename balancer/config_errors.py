"""Configuration errors that name the line: ``balancer.toml:12: …``.

``tomllib`` keeps no positions, so once validation has failed this module
finds where: :func:`culprit` narrows the error down to a key path (which
key or table makes the same validation fail on its own), and
:func:`key_lines` is a line index of the file (tables, array-of-tables
entries, keys, the elements of arrays) to turn that path into a line
number. Neither runs on a valid file; both are best effort: a path they
cannot place names the nearest enclosing table, or no line at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["culprit", "key_lines", "line_of"]

Path = tuple[str | int, ...]


def _split_key(raw: str) -> tuple[str, ...]:
    """``a."b.c".d`` → ("a", "b.c", "d")."""
    parts, cur, quote = [], "", ""
    for ch in raw.strip():
        if quote:
            if ch == quote:
                quote = ""
            else:
                cur += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ".":
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return tuple(parts)


def _within_arrays(name: Path, counters: dict[Path, int]) -> Path:
    """A table header's path with the index of each array of tables it is
    inside: as TOML reads it, ``[routes.rate_limit]`` after the second
    ``[[routes]]`` is ``routes[1].rate_limit``."""
    out: Path = ()
    for i, part in enumerate(name):
        out = (*out, part)
        if i < len(name) - 1 and out in counters:
            out = (*out, counters[out])
    return out


def key_lines(text: str) -> dict[Path, int]:
    """Key path → 1-based line where it is defined (first definition wins).

    ``[t]`` maps ``("t",)``; the n-th ``[[a]]`` maps ``("a", n)`` (and
    ``("a",)`` to the first); ``k = v`` maps the table's path + ``k``; the
    n-th element of an array value maps path + ``n``.
    """
    out: dict[Path, int] = {}
    table: Path = ()
    counters: dict[Path, int] = {}
    depth = 0  # brackets/braces open across lines
    ml: str = ""  # the quote of a multi-line string under way
    array: Path | None = None  # the top-level-of-a-value array whose elements are counted
    count = 0
    expecting = False
    for no, line in enumerate(text.splitlines(), 1):
        i = 0
        if ml:
            end = line.find(ml)
            if end < 0:
                continue
            i, ml = end + 3, ""
        elif depth == 0:
            s = line.strip()
            if s.startswith("[["):
                end = s.find("]]")
                name = _within_arrays(_split_key(s[2:end] if end > 0 else s[2:]), counters)
                n = counters[name] = counters.get(name, -1) + 1
                table = (*name, n)
                out.setdefault(name, no)
                out.setdefault(table, no)
                continue
            if s.startswith("["):
                end = s.find("]")
                table = _within_arrays(_split_key(s[1:end] if end > 0 else s[1:]), counters)
                out.setdefault(table, no)
                continue
            if not s or s.startswith("#"):
                continue
            eq = _find_eq(line)
            if eq < 0:
                continue
            path = (*table, *_split_key(line[:eq]))
            out.setdefault(path, no)
            i = eq + 1
            array, count, expecting = path, 0, False
        # the value: strings, comments, brackets; elements of the outer array counted
        while i < len(line):
            ch = line[i]
            if ch == "#":
                break
            if depth == 1 and expecting and array is not None and ch not in " \t,]":
                out.setdefault((*array, count), no)
                count += 1
                expecting = False
            if line.startswith(('"""', "'''"), i):
                q = line[i:i + 3]
                end = line.find(q, i + 3)
                if end < 0:
                    ml = q
                    break
                i = end + 3
                continue
            if ch in "\"'":
                j = i + 1
                while j < len(line) and line[j] != ch:
                    j += 2 if ch == '"' and line[j] == "\\" else 1
                i = j + 1
                continue
            if ch in "[{":
                depth += 1
                if depth == 1 and ch == "[":
                    expecting = True
            elif ch in "]}":
                depth = max(0, depth - 1)
            elif ch == "," and depth == 1:
                expecting = True
            i += 1
    return out


def _find_eq(line: str) -> int:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "=":
            return i
    return -1


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of ``path``, or of its nearest enclosing key or table."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None


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
