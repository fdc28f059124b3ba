"""Regular expressions of routes and the rewrite of a forwarded request's
target (the path and the query), as configured.

The patterns are the ``regex`` crate's, which the data plane compiles
(``rustext/src/balancer/route/rewrite.rs``): they are checked here by the
same compiler, so that a bad one is a configuration error at load, located
on its line, and never a surprise at reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from balancer.errors import BalancerConfigError
from rustext.fields import check_fields

#: the longest pattern accepted, in bytes
MAX_PATTERN = 1024
#: the longest path ``set_path`` may give, in bytes
MAX_TARGET = 8192


def check_regex(pattern: Any, where: str, replacement: str | None = None) -> str:
    """``pattern`` if the data plane compiles it (and ``replacement`` names
    only its groups), else BalancerConfigError naming ``where``."""
    import rustext  # the compiled data plane, as the access log format's check

    if not isinstance(pattern, str) or not pattern:
        raise BalancerConfigError(f"{where} must be a non-empty string, got {pattern!r}")
    try:
        rustext.Balancer.check_regex(pattern, replacement)
    except ValueError as exc:
        raise BalancerConfigError(f"{where}: {exc}") from None
    return pattern


def _target_part(value: Any, where: str, *, path: bool) -> str:
    """A path (starting with ``/``, no ``?``) or a query: visible ASCII without ``#``."""
    if not isinstance(value, str):
        raise BalancerConfigError(f"{where} must be a string, got {value!r}")
    if path and not value.startswith("/"):
        raise BalancerConfigError(f"{where} {value!r} must start with /")
    bad = next((c for c in value if not ("!" <= c <= "~") or c == "#" or (path and c == "?")), None)
    if bad is not None:
        what = "a path" if path else "a query"
        raise BalancerConfigError(f"{where} {value!r} holds {bad!r}, which {what} may not (percent-encode it)")
    if len(value) > MAX_TARGET:
        raise BalancerConfigError(f"{where} is over {MAX_TARGET} bytes")
    return value


@dataclass(frozen=True, kw_only=True)
class ReplacePath:
    """When ``regex`` matches the path, the path becomes ``replacement``, in
    which ``$1`` / ``${1}`` / ``${name}`` are the pattern's groups and ``$$``
    is a ``$`` (HAProxy's ``replace-path``, nginx's ``rewrite``)."""

    #: the pattern, searched in the path (anchor it with ``^`` and ``$``)
    regex: str
    #: the new path: starts with ``/`` (or a group that does)
    replacement: str


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """How a route changes the target it forwards, after routing: at most one
    of ``strip_prefix``, ``replace_path`` and ``set_path``, and at most one of
    ``set_query`` and ``remove_query``. The query is kept when only the path
    changes. The access log keeps the client's target."""

    #: remove this prefix from the path (a path left without its leading ``/`` gets one)
    strip_prefix: str | None = None
    #: replace the path by a template with the captures of a pattern
    #: (``{ regex = '^/old/(.*)$', replacement = '/new/$1' }``)
    replace_path: ReplacePath | None = None
    #: this path instead
    set_path: str | None = None
    #: this query instead (without ``?``)
    set_query: str | None = None
    #: no query
    remove_query: bool = False
    where: str = field(default="rewrite", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        w = self.where
        if isinstance(self.replace_path, Mapping):
            data = dict(self.replace_path)
            unknown = set(data) - {f.name for f in fields(ReplacePath)}
            if unknown:
                raise BalancerConfigError(f"unknown key(s) in {w}.replace_path: {', '.join(sorted(unknown))}")
            try:
                replace = ReplacePath(**check_fields(ReplacePath, data, f"{w}.replace_path"))
            except TypeError as exc:
                raise BalancerConfigError(f"{w}.replace_path needs regex and replacement") from exc
            object.__setattr__(self, "replace_path", replace)
        if self.replace_path is not None and not isinstance(self.replace_path, ReplacePath):
            raise BalancerConfigError(f"{w}.replace_path must be a table {{ regex = ..., replacement = ... }}")
        if sum(x is not None for x in (self.strip_prefix, self.replace_path, self.set_path)) > 1:
            raise BalancerConfigError(f"{w}: give one of strip_prefix, replace_path and set_path")
        if self.strip_prefix is not None:
            _target_part(self.strip_prefix, f"{w}.strip_prefix", path=True)
        if self.set_path is not None:
            _target_part(self.set_path, f"{w}.set_path", path=True)
        if self.replace_path is not None:
            rp = self.replace_path
            check_regex(rp.regex, f"{w}.replace_path.regex")
            if not isinstance(rp.replacement, str):
                raise BalancerConfigError(f"{w}.replace_path.replacement must be a string")
            import rustext

            try:  # the replacement's groups against the pattern's
                rustext.Balancer.check_regex(rp.regex, rp.replacement)
            except ValueError as exc:  # its messages start with "replace_path."
                raise BalancerConfigError(f"{w}.{exc}") from None
        if not isinstance(self.remove_query, bool):
            raise BalancerConfigError(f"{w}.remove_query must be true or false")
        if self.set_query is not None:
            if self.remove_query:
                raise BalancerConfigError(f"{w}: give set_query or remove_query, not both")
            _target_part(self.set_query, f"{w}.set_query", path=False)

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.strip_prefix, self.replace_path, self.set_path, self.set_query)) \
            or self.remove_query
