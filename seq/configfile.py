"""A seq process's TOML file (``juggler seq server --config``, ``juggler
seq snowflake --config``): flat keys named as the fields of the process's
configuration dataclass (:class:`seq.startup.ServerConfig`,
:class:`seq.worker.WorkerConfig`), so the configuration reference is also
the file's. Flags given on the command line override the file.

Every error names the file and the line (``seq.toml:4: peer_timeout:
expected a number of seconds, got 'fast'``), as the balancer's and
juggler's files do: types are checked here, key by key; a value the
dataclass itself refuses is placed by building the configuration again
with that key alone on top of a known-good one.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rustext.tomllines import key_lines, line_of, read_toml

__all__ = ["ConfigFile", "build"]

C = TypeVar("C")


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _strings(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError(f'expected a list of strings such as ["10.0.0.2:7000"], got {v!r}')
    return tuple(v)


def _bits(v: Any) -> tuple[int, int, int]:
    from seq.snowflake import parse_bits

    if isinstance(v, str):
        return parse_bits(v)
    if isinstance(v, list) and len(v) == 3 and all(isinstance(b, int) and not isinstance(b, bool) for b in v):
        return parse_bits(",".join(map(str, v)))
    raise ValueError(f'expected [TIME, WORKER, SEQUENCE] such as [41, 10, 12], got {v!r}')


#: how a field's annotation is read from TOML (annotations are strings here)
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": _str,
    "str | None": _str,
    "float": _number,
    "int": _int,
    "bool": _bool,
    "tuple[str, ...]": _strings,
    "tuple[int, int, int]": _bits,
}


class ConfigFile:
    """One TOML file read for the dataclass `cls`: its values by field name,
    type-checked, and where each key is.

    `flag_only` fields cannot be set in the file (a start mode is a decision
    for one start, not a setting), each with the flags that set it; `extra`
    keys are the command's own (``metrics_port``, ``log_level``), returned
    apart by :attr:`extra`."""

    def __init__(self, path: str, cls: type, *, flag_only: Mapping[str, str] | None = None,
                 extra: Mapping[str, Callable[[Any], Any]] | None = None) -> None:
        self.path = path
        text, data = read_toml(path)
        self._lines = key_lines(text)
        flag_only = dict(flag_only or {})
        readers = {f.name: _READERS[str(f.type)] for f in dataclasses.fields(cls)
                   if f.init and f.name not in flag_only and str(f.type) in _READERS}
        extra = dict(extra or {})
        known = sorted({*readers, *extra})
        self.values: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in flag_only:
                raise ValueError(f"{self.where(key)}: {key} is chosen on the command line only ({flag_only[key]})")
            reader = readers.get(key) or extra.get(key)
            if reader is None:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
                kind = "table" if isinstance(value, dict) else "setting"
                raise ValueError(f"{self.where(key)}: unknown {kind} {key!r}{hint}")
            try:
                read = reader(value)
            except ValueError as exc:
                raise ValueError(f"{self.where(key)}: {key}: {exc}") from None
            (self.values if key in readers else self.extra)[key] = read

    def where(self, key: str) -> str:
        """``FILE:LINE`` of a key (the file alone when it cannot be placed)."""
        line = line_of(self._lines, (key,))
        return f"{self.path}:{line}" if line else self.path


def build(cls: type[C], flags: Mapping[str, Any], file: ConfigFile | None, *,
          probe: Mapping[str, Any], names: Mapping[str, str]) -> C:
    """``cls`` from the file's values with the flags given on top.

    A value the dataclass refuses is blamed on the file's line when the file
    gave it (found by building `probe`, a valid configuration, with that key
    alone from the file); `names` spell fields as the user wrote them when
    they came from flags (``data_dir`` → ``--data``), for missing ones."""
    values = {**(file.values if file else {}), **flags}
    required = [f.name for f in dataclasses.fields(cls)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in values]
    if missing:
        def how(n: str) -> str:
            return f"{names.get(n, '--' + n.replace('_', '-'))} (or {n} = … in --config FILE)"
        raise ValueError("missing " + ", ".join(how(n) for n in missing))
    try:
        return cls(**values)
    except ValueError as exc:
        if file is not None:
            for key, value in file.values.items():
                if key in flags:
                    continue
                try:
                    cls(**{**probe, key: value})
                except ValueError:
                    raise ValueError(f"{file.where(key)}: {exc}") from None
        raise
