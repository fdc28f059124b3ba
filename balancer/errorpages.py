"""Error pages (the ``[error_pages]`` table, HAProxy's ``errorfile``, nginx's
``error_page``): what the balancer answers instead of its own one-line texts
(``503 no backend available``, ``504 backend timeout``, ``429``, ...).

A page file is either HAProxy's raw form, a whole HTTP response (status
line, header fields, blank line, body: the files of ``/etc/haproxy/errors``
take over unchanged), or just a body, its ``Content-Type`` told by the file's
extension. Files are read at load and on every reload; the data plane gets
their fields and bytes (``rustext/src/balancer/route.rs``, ``ErrorPage``).
"""

from __future__ import annotations

import http.client
import io
import mimetypes
import os
from dataclasses import dataclass
from typing import Any

from balancer.errors import BalancerConfigError

__all__ = ["ERROR_PAGE_STATUSES", "MAX_PAGE", "ErrorPage", "content_type_of", "load_error_pages", "read_page"]

#: the statuses a page may be given for: HAProxy's ``errorfile`` list (the balancer itself
#: answers 400, 429, 431, 502, 503 and 504; pages for the others are kept for nothing)
ERROR_PAGE_STATUSES = (200, 400, 401, 403, 404, 405, 407, 408, 410, 413, 425, 429, 431, 500, 501, 502, 503, 504)
#: a page's size at most (HAProxy's pages must fit its 16 KiB buffer)
MAX_PAGE = 64 * 1024
#: header fields the balancer writes itself (framing, the connection's fate): dropped from a raw page
FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "trailer", "te"})


@dataclass(frozen=True)
class ErrorPage:
    """An answer of the balancer's own, read from its file: the data plane sends it as it is."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _raw(data: bytes, where: str, status: int) -> ErrorPage:
    """HAProxy's form: a whole response; its body ends where the data does
    (or at its ``Content-Length``)."""

    class Source:
        def makefile(self, _mode: str) -> io.BytesIO:
            return io.BytesIO(data)

    resp = http.client.HTTPResponse(Source())  # type: ignore[arg-type]
    try:
        resp.begin()
        body = resp.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise BalancerConfigError(f"{where}: not a valid HTTP response ({type(exc).__name__}: {exc})") from None
    if resp.status != status:
        raise BalancerConfigError(f"{where}: the file answers {resp.status}, not {status}")
    headers = tuple((k, v) for k, v in resp.getheaders() if k.lower() not in FRAMING)
    if not any(k.lower() == "content-type" for k, _ in headers):
        headers = (("Content-Type", "text/html"), *headers)
    return ErrorPage(status, headers, body)


def content_type_of(path: str) -> str:
    """A page file's ``Content-Type``, told by its extension."""
    kind, _ = mimetypes.guess_type(path)
    kind = kind or "text/plain"
    return f"{kind}; charset=utf-8" if kind.startswith("text/") or kind == "application/json" else kind


def read_page(path: Any, where: str) -> bytes:
    """A page file's bytes (at most ``MAX_PAGE``); errors name ``where``."""
    if not isinstance(path, str) or not path:
        raise BalancerConfigError(f"{where} must be a file name")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PAGE + 1)
    except OSError as exc:
        raise BalancerConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_PAGE:
        raise BalancerConfigError(f"{where}: {path} is over {MAX_PAGE // 1024} KiB")
    return data


def load_error_pages(table: Any, where: str = "error_pages") -> tuple[ErrorPage, ...]:
    """``{"503": "/path/503.http", ...}`` → the pages, read now; errors name the key."""
    if not isinstance(table, dict):
        raise BalancerConfigError(f"{where} must be a table of status = \"file\" (such as 503 = \"503.http\")")
    pages: list[ErrorPage] = []
    for key, path in table.items():
        w = f"{where}.{key}"
        try:
            status = int(key)
        except (TypeError, ValueError):
            status = 0
        if status not in ERROR_PAGE_STATUSES:
            raise BalancerConfigError(
                f"{w}: the key must be one of the statuses {', '.join(map(str, ERROR_PAGE_STATUSES))}")
        if any(p.status == status for p in pages):
            raise BalancerConfigError(f"{w}: a second page for {status}")
        data = read_page(path, w)
        if data.startswith(b"HTTP/"):
            pages.append(_raw(data, f"{w} ({path})", status))
        else:
            pages.append(ErrorPage(status, (("Content-Type", content_type_of(os.fspath(path))),
                                            ("Cache-Control", "no-store")), data))
    return tuple(pages)
