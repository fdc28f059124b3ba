"""Shopify's toxiproxy between the processes of a fault test, and a small client
for its HTTP API.

``toxiproxy-server`` is the binary ``scripts/install-toxiproxy`` builds from
its Go module (v2.5.0); when it is missing and Go is here the fixture builds
it (seconds, once); without Go the tests skip, or fail in CI.

A :class:`Link` is one proxy: clients connect to ``link.port``, toxiproxy
forwards to the upstream. Toxics make the link misbehave (toxiproxy's own
names and attributes, milliseconds and bytes):

- ``latency`` (``latency``, ``jitter``): every chunk is delayed;
- ``bandwidth`` (``rate``, KB/s);
- ``slow_close`` (``delay``): the close is delayed;
- ``timeout`` (``timeout``; 0 = forever): nothing gets through, then the
  connection is closed -- with 0, a peer that stops answering (half-open);
- ``reset_peer`` (``timeout``): the connection is reset (RST) after that long;
- ``limit_data`` (``bytes``): the connection is closed after that many bytes.

``link.disable()`` closes every connection and refuses new ones (the
upstream is gone, as the client sees it); ``link.enable()`` brings it back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.netutil import ServerProcess, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-toxiproxy"
BINARY = ROOT / "build" / "toxiproxy" / "v2.5.0" / "toxiproxy-server"

__all__ = ["Link", "Toxiproxy", "toxiproxy", "toxiproxy_binary"]


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{why} (in CI the fault tests must run)")
    pytest.skip(why)


def toxiproxy_binary() -> Path:
    """toxiproxy-server, built by scripts/install-toxiproxy if missing."""
    if BINARY.is_file():
        return BINARY
    if shutil.which("go") is None:
        _unavailable("toxiproxy is not built and Go is not installed to build it (scripts/install-toxiproxy)")
    res = subprocess.run([str(INSTALL)], check=False, capture_output=True, text=True, timeout=600)
    if res.returncode != 0 or not BINARY.is_file():
        _unavailable(f"scripts/install-toxiproxy failed: {res.stderr[-2000:]}")
    return BINARY


class Toxiproxy:
    """The API of one running toxiproxy-server (blocking calls on loopback, each bounded)."""

    def __init__(self, api_port: int) -> None:
        self.api = f"http://127.0.0.1:{api_port}"
        self._links: list[Link] = []

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"toxiproxy {method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        return json.loads(raw) if raw.strip() else None

    def link(self, name: str, upstream: str, port: int | None = None, host: str = "127.0.0.1") -> Link:
        """A new proxy ``name`` listening on ``host``:``port`` (a free one by default) to
        ``upstream``; ``host`` may be any 127.x address (Linux routes all of 127/8 to loopback)."""
        port = port or free_port()
        self.request("POST", "/proxies", {"name": name, "listen": f"{host}:{port}",
                                          "upstream": upstream, "enabled": True})
        link = Link(self, name, port, upstream, host)
        self._links.append(link)
        return link

    def reset(self) -> None:
        """Every link enabled, every toxic removed."""
        self.request("POST", "/reset")

    def delete_all(self) -> None:
        """Delete every link made through this object."""
        for link in self._links:
            try:
                self.request("DELETE", f"/proxies/{link.name}")
            except RuntimeError:
                pass
        self._links.clear()


@dataclass
class Link:
    """One proxy of a :class:`Toxiproxy`: connect to ``port`` to reach ``upstream`` through it."""

    server: Toxiproxy
    name: str
    port: int
    upstream: str
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def toxic(self, kind: str, stream: str = "downstream", *, name: str | None = None,
              toxicity: float = 1.0, **attributes: int) -> str:
        """Add a toxic of ``kind`` on ``stream`` (``downstream``: what the upstream
        sends back; ``upstream``: what the client sends); returns its name."""
        name = name or f"{kind}_{stream}"
        self.server.request("POST", f"/proxies/{self.name}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes})
        return name

    def remove(self, toxic: str) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def clear(self) -> None:
        """Remove every toxic of this link."""
        for t in self.server.request("GET", f"/proxies/{self.name}/toxics") or []:
            self.remove(t["name"])

    def disable(self) -> None:
        """Close every connection through the link and refuse new ones."""
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": True})


@pytest.fixture(scope="session")
def toxiproxy_server() -> Iterator[Toxiproxy]:
    """One toxiproxy-server for the session, its API on a free loopback port."""
    exe = toxiproxy_binary()
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="toxiproxy-")
    with open(os.path.join(workdir, "toxiproxy.log"), "wb") as log:
        proc = subprocess.Popen([str(exe), "-host", "127.0.0.1", "-port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(port=port, proc=proc, dir=workdir)
    try:
        wait_for_port(port, proc=proc)
        yield Toxiproxy(port)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def toxiproxy(toxiproxy_server: Toxiproxy) -> Iterator[Toxiproxy]:
    """The session's toxiproxy; the links a test made are deleted after it."""
    yield toxiproxy_server
    toxiproxy_server.delete_all()
