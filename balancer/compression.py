"""Typed configuration of response compression (``compress`` on a listener
or a route, as nginx's ``gzip on`` and Caddy's ``encode``). The data plane
reads :class:`Compression` and decides per response (``encode.rs``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from balancer.errors import BalancerConfigError
from rustext.fields import check_fields

#: the codings the balancer produces, in its default order of preference
CODINGS = ("zstd", "br", "gzip")
#: compressed by default: nginx's ``gzip_types`` and Caddy's ``encode`` defaults (text, JSON,
#: JavaScript, XML, SVG, WebAssembly, fonts); ``text/event-stream`` is left out unless named
DEFAULT_TYPES = (
    "text/*",
    "application/json", "application/*+json", "application/javascript", "application/x-javascript",
    "application/ecmascript", "application/xml", "application/*+xml", "application/xhtml+xml",
    "application/rss+xml", "application/atom+xml", "application/wasm", "application/graphql-response+json",
    "application/x-ndjson", "application/manifest+json", "application/vnd.api+json",
    "image/svg+xml", "image/x-icon", "image/vnd.microsoft.icon", "image/bmp",
    "font/ttf", "font/otf", "font/eot", "application/vnd.ms-fontobject",
)
#: excluded from ``text/*`` unless listed on its own: an event stream is a long-lived response
#: whose events must arrive as they are sent
NOT_BY_DEFAULT = ("text/event-stream",)
_LEVELS = {"gzip": (1, 9), "br": (0, 11), "zstd": (1, 19)}
_TYPE = re.compile(r"^[a-z0-9!#$&^_.+-]+/[a-z0-9!#$&^_.+-]*\*?[a-z0-9!#$&^_.+-]*$")


@dataclass(frozen=True, kw_only=True)
class Compression:
    """Response compression (``compress = true`` or a table): gzip, brotli and zstd chosen by
    the client's ``Accept-Encoding``, streamed (a flush whenever the backend pauses)."""

    #: ``false`` turns it off (a route's ``compress = false`` under a listener's ``compress``)
    enabled: bool = True
    #: the codings offered, in the balancer's order of preference among those the client weighs
    #: equally: any of ``zstd``, ``br``, ``gzip``
    algorithms: tuple[str, ...] = CODINGS
    #: gzip's level, 1..9 (nginx's ``gzip_comp_level``)
    gzip_level: int = 6
    #: brotli's quality, 0..11 (above 5, slow for a proxy)
    br_level: int = 4
    #: zstd's level, 1..19
    zstd_level: int = 3
    #: media types compressed: ``type/subtype``, ``type/*``, or ``application/*+json`` (a suffix);
    #: default: text (but ``text/event-stream``), JSON, JavaScript, XML, SVG, WebAssembly, fonts
    types: tuple[str, ...] = DEFAULT_TYPES
    #: a response whose ``Content-Length`` is below this many bytes is sent as it is (a response
    #: of unknown length is compressed)
    min_length: int = 256
    where: str = field(default="compress", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        w = self.where
        if not self.algorithms:
            raise BalancerConfigError(f"{w}.algorithms: give at least one of zstd, br, gzip")
        for a in self.algorithms:
            if a not in CODINGS:
                raise BalancerConfigError(f"{w}.algorithms: unknown coding {a!r} (expected zstd, br or gzip)")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise BalancerConfigError(f"{w}.algorithms: a coding is listed twice")
        for name, (lo, hi) in _LEVELS.items():
            level = getattr(self, f"{name}_level")
            if not lo <= level <= hi:
                raise BalancerConfigError(f"{w}.{name}_level must be in {lo}..{hi}, got {level!r}")
        object.__setattr__(self, "types", tuple(t.strip().lower() for t in self.types))
        for t in self.types:
            if not _TYPE.match(t) or t.endswith("/"):
                raise BalancerConfigError(f"{w}.types: invalid media type {t!r} (type/subtype or type/*)")
        if not 0 <= self.min_length <= 2**63:
            raise BalancerConfigError(f"{w}.min_length must be an integer >= 0, got {self.min_length!r}")


def compression(value: Any, where: str) -> Compression | None:
    """A ``compress`` key's value: ``true`` (the defaults), ``false`` (off), or a table."""
    if value is None or isinstance(value, Compression):
        return value
    if value is True:
        return Compression(where=where)
    if value is False:
        return Compression(enabled=False, where=where)
    if isinstance(value, Mapping):
        known = {f.name for f in fields(Compression) if not f.metadata.get("internal")}
        if unknown := set(value) - known:
            raise BalancerConfigError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}")
        try:
            return Compression(**check_fields(Compression, value, where), where=where)
        except ValueError as exc:  # check_fields names the key already
            raise BalancerConfigError(str(exc)) from exc
    raise BalancerConfigError(f"{where} must be true, false or a table, got {value!r}")
