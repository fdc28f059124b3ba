"""What a connect proxy is told of a handshake request: the allowed headers
and cookies, the token, the client's address. Sans-I/O: it reads a
request's headers and path, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["allowed_cookies", "allowed_headers", "bearer_token", "remote_address"]


def allowed_headers(headers: Any, allow: Iterable[str]) -> dict[str, str]:
    """The headers named in `allow` (case-insensitive) that the request has,
    keyed as `allow` spells them; repeated ones joined with ``", "``."""
    out: dict[str, str] = {}
    for name in allow:
        values = headers.get_all(name) if hasattr(headers, "get_all") else [headers.get(name)]
        values = [v for v in values if v is not None]
        if values:
            out[name] = ", ".join(values)
    return out


def allowed_cookies(headers: Any, allow: Iterable[str]) -> dict[str, str]:
    """The cookies named in `allow` (exact names) that the ``Cookie`` headers
    carry (``name=value; name2=value2``, as browsers send them; a quoted
    value is unquoted). A pair that does not parse is skipped, not an error:
    the backend decides what a missing cookie means. The first of a name wins."""
    wanted = set(allow)
    if not wanted:
        return {}
    values = headers.get_all("Cookie") if hasattr(headers, "get_all") else [headers.get("Cookie")]
    out: dict[str, str] = {}
    for value in values:
        for pair in (value or "").split(";"):
            name, eq, v = pair.partition("=")
            name, v = name.strip(), v.strip()
            if not eq or not name or name not in wanted or name in out:
                continue
            if len(v) >= 2 and v[0] == v[-1] == '"':
                v = v[1:-1]
            out[name] = v
    return out


def bearer_token(headers: Mapping[str, str] | Any, path: str, *, header: str = "Authorization",
                 query_param: str = "token") -> str | None:
    """The token of a handshake: ``Authorization: Bearer …`` (the prefix is
    optional), else the ``?token=`` query parameter (browsers cannot set
    headers on a websocket)."""
    if header:
        value = headers.get(header)
        if value:
            if value[:7].lower() == "bearer ":
                value = value[7:]
            value = value.strip()
            if value:
                return str(value)
    if query_param:
        query = urlsplit(path).query
        if query:
            values = parse_qs(query).get(query_param)
            if values:
                return values[0]
    return None


def remote_address(peer: Any) -> str:
    """``HOST:PORT`` of a socket's peer name (``[v6]:PORT`` for IPv6)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "" if peer is None else str(peer)
