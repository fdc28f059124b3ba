"""Where a key is in a TOML file: ``tomllib`` keeps no positions, so a
configuration error found after parsing is placed by this line index
(tables, array-of-tables entries, keys, the elements of arrays) to say
``file.toml:12: …``. Best effort: a path it cannot place gives the nearest
enclosing table, or no line. Used by the balancer's, juggler's and seq's
configuration files, which read them with :func:`read_toml`."""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

__all__ = ["Path", "key_lines", "line_of", "read_toml"]

#: a key path: table and key names, and the index of an array (of tables) element
Path = tuple[str | int, ...]


def read_toml(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """A TOML file's text (for :func:`key_lines`) and its data; ValueError
    naming the file, and the line where TOML says it
    (``balancer.toml:3: invalid TOML: Expected '=' after a key``)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        text = raw.decode()
        return text, tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: not UTF-8 (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r" \(at line (\d+), column \d+\)$", str(exc))
        if found is None:
            raise ValueError(f"{path}: invalid TOML: {exc}") from exc
        raise ValueError(f"{path}:{found.group(1)}: invalid TOML: {str(exc)[:found.start()]}") from exc


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
