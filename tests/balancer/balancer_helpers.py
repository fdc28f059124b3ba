"""Helpers of the balancer tests: backend processes, the configuration of a
balancer in front of them, raw HTTP exchanges."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from balancer.config import BalancerConfig, from_dict
from tests.netutil import free_port

BACKEND = os.path.join(os.path.dirname(__file__), "backend.py")
PATTERN = bytes(range(251)) * 4096


def pattern(n: int) -> bytes:
    """The backend's body for /size/n."""
    reps, rest = divmod(n, len(PATTERN))
    return PATTERN * reps + PATTERN[:rest]


@dataclass
class BackendProc:
    name: str
    port: int
    proc: subprocess.Popen
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def lb_config(bks: Sequence[Any] = (), **settings: Any) -> BalancerConfig:
    """A configuration in front of ``bks`` (backends, their addresses or tables)
    on a free port with two workers;
    ``settings``: top-level keys and tables of the balancer's file (as
    :func:`balancer.config.from_dict` takes them). With ``listeners``, there
    is no ``listen``; with named pools (``backends`` a table), no list."""
    data: dict[str, Any] = {"listen": "127.0.0.1:0", "workers": 2,
                            "backends": [b if isinstance(b, (str, dict)) else b.address for b in bks]}
    data.update(settings)
    if "listeners" in settings:
        del data["listen"]
    return from_dict(data)


def start_backend(name: str, port: int | None = None, tls: tuple[str, str] | None = None,
                  host: str = "127.0.0.1") -> BackendProc:
    """A backend process on ``host`` (any 127.x address on Linux); ``tls`` =
    (certificate, key) serves HTTPS. Without a ``port``, a free one: tried
    again on another when another process took it first (a busy machine)."""
    for _ in range(3 if port is None else 1):
        chosen = port or free_port()
        proc = subprocess.Popen([sys.executable, BACKEND, f"{host}:{chosen}", name, *(tls or ())],
                                stdout=subprocess.PIPE)
        if _ready(proc):
            return BackendProc(name, chosen, proc, host)
    raise RuntimeError(f"backend {name} did not start")


def _ready(proc: subprocess.Popen) -> bool:
    """Whether a backend process said it is ready; one that did not is reaped."""
    assert proc.stdout is not None
    if proc.stdout.readline().strip() == b"ready":
        return True
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()
    return False


def start_unix_backend(name: str, path: str) -> subprocess.Popen:
    """A backend process serving HTTP on the Unix socket at ``path``."""
    proc = subprocess.Popen([sys.executable, BACKEND, f"unix:{path}", name], stdout=subprocess.PIPE)
    if not _ready(proc):
        raise RuntimeError(f"backend {name} did not start")
    return proc


def raw_exchange(port: int, request: bytes, timeout: float = 30.0) -> bytes:
    """Send raw bytes, read until the server closes; returns everything read."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while data := s.recv(1 << 20):
            chunks.append(data)
    return b"".join(chunks)


def split_response(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return lines[0], headers, body


def dechunk(body: bytes) -> bytes:
    out = bytearray()
    i = 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[j + 2 : j + 2 + size]
        i = j + 2 + size + 2
