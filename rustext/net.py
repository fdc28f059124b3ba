"""Addresses and listening sockets, the same for every part of the suite.

- :func:`parse_hostport` / :func:`join_hostport`: ``HOST:PORT`` (``[v6]:PORT``)
  read and written in one place, with one kind of error message.
- :class:`ListenError`: one error type for "cannot listen", whichever server
  (juggler's, rpc's, seq's, the balancer's, a metrics endpoint) failed to
  bind, so every command reports it the same way, in one line.
"""

from __future__ import annotations

import errno
import os
import re

__all__ = ["ListenError", "check_hostport", "join_hostport", "listen_error", "parse_hostport", "raise_open_files_limit"]


def parse_hostport(text: str, *, what: str = "address", default_host: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` → (host, port). With `default_host`,
    ``:PORT`` means that host; without, a host is required. Raises
    ValueError naming `what` (``listen address must be HOST:PORT, got
    'nowhere'``, ``invalid port in '127.0.0.1:x'``)."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be HOST:PORT, got {text!r}")
    host, sep, port_s = text.rpartition(":")
    if not sep:
        raise ValueError(f"{what} must be HOST:PORT, got {text!r}")
    if not port_s.isdigit() or not port_s.isascii():
        raise ValueError(f"invalid port in {text!r} ({what} must be HOST:PORT)")
    port = int(port_s)
    if port > 65535:
        raise ValueError(f"port out of range in {text!r} (0 to 65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        if default_host is None:
            raise ValueError(f"{what} must be HOST:PORT, got {text!r} (no host)")
        host = default_host
    return host, port


def check_hostport(text: str, *, what: str = "address") -> str:
    """`text` itself, once :func:`parse_hostport` accepts it (ValueError otherwise)."""
    parse_hostport(text, what=what)
    return text


def join_hostport(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:80``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ListenError(OSError):
    """A server could not listen on its address. ``str()`` is one line a user
    can act on: ``cannot listen on 127.0.0.1:9000: address already in use``."""

    def __init__(self, host: str, port: int | str, reason: str, err: int | None = None) -> None:
        super().__init__(err or 0, f"cannot listen on {join_hostport(host, port)}: {reason}")
        self.host, self.port, self.reason = host, port, reason

    def __str__(self) -> str:
        return str(self.strerror)


def listen_error(host: str, port: int | str, exc: OSError) -> ListenError:
    """The :class:`ListenError` for a failed bind/listen (``raise … from exc``)."""
    if isinstance(exc, ListenError):
        return exc
    code = exc.errno
    if code is None:  # the native servers' errors carry it in their text: "... (os error 98)"
        found = re.search(r"\(os error (\d+)\)", str(exc))
        code = int(found.group(1)) if found else None
    if code is not None and code in errno.errorcode:
        reason = os.strerror(code).lower()
    else:
        reason = str(exc.strerror or exc).lower()
    return ListenError(host, port, reason, code)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open descriptors to its hard limit
    (as Go's runtime does at start): a server holding thousands of
    connections must not stop at a distribution's default of 1024. Returns
    the limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft
