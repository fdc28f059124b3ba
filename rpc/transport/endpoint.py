"""Endpoints: the key of a transport (``tcp://host:port``, ``quic://host:port``, ``kcp://host:port``,
``unix:///path``, ``inproc://name``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["tcp", "quic", "kcp", "unix", "inproc"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server listens / a client connects; hashable (pool key)."""

    kind: Kind
    host: str = ""
    port: int = 0
    path: str = ""  # unix socket path or inproc name

    @classmethod
    def parse(cls, text: str | Endpoint) -> Endpoint:
        if isinstance(text, Endpoint):
            return text
        scheme, sep, rest = text.partition("://")
        if not sep:
            raise ValueError(f"endpoint {text!r}: expected tcp://host:port, quic://host:port, kcp://host:port, "
                             "unix:///path or inproc://name")
        if scheme in ("tcp", "quic", "kcp"):
            host, colon, port = rest.rpartition(":")
            if not colon or not port.isdigit():
                raise ValueError(f"endpoint {text!r}: expected {scheme}://host:port")
            return cls(scheme, host=host.strip("[]") or "127.0.0.1", port=int(port))  # type: ignore[arg-type]
        if scheme == "unix":
            if not rest:
                raise ValueError(f"endpoint {text!r}: empty unix socket path")
            return cls("unix", path=rest)
        if scheme == "inproc":
            if not rest:
                raise ValueError(f"endpoint {text!r}: empty inproc name")
            return cls("inproc", path=rest)
        raise ValueError(f"endpoint {text!r}: unknown scheme {scheme!r}")

    def __str__(self) -> str:
        if self.kind in ("tcp", "quic", "kcp"):
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"{self.kind}://{host}:{self.port}"
        return f"{self.kind}://{self.path}"
