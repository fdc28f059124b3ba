"""Building the Go rpcx peers of the interop tests (``tests/rpc/interop/*``,
each its own Go module) into a temporary directory.

The build needs ``go`` and the Go module proxy (or a warm module cache).
Without ``go`` the interop tests are skipped on a developer's machine and
fail in CI (``CI=true``), where interop must never go untested.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.netutil import free_port

INTEROP = Path(__file__).parent / "interop"


def build_go_peer(tmp_path_factory: pytest.TempPathFactory, module: str, what: str, tags: str = "") -> Path:
    """Build ``tests/rpc/interop/{module}`` (with the build ``tags``) and return
    the binary; ``what`` names the peer in the skip/fail message ("the
    rpcx-etcd interop peer")."""
    go = shutil.which("go")
    if go is None:
        why = f"Go is not installed: {what} cannot be built"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{why} (in CI the interop tests must run)")
        pytest.skip(why)
    out = tmp_path_factory.mktemp(module) / module
    res = subprocess.run([go, "build", *(["-tags", tags] if tags else []), "-o", str(out), "."], cwd=INTEROP / module,
                         capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "CGO_ENABLED": "0"})
    assert res.returncode == 0, f"go build of {INTEROP / module} failed:\n{res.stderr}"
    return out


class GoServer:
    """A Go peer's ``server ADDR REGISTRY BASE [GROUP]`` mode: rpcx's Arith on
    a free port, registered in a registry, answering ``Server: "go@ADDR"`` so
    that a test can tell who answered. Started when it printed ``ready``."""

    def __init__(self, peer: Path, registry: str, base: str, group: str = "", *,
                 env: dict[str, str] | None = None) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        self.address = f"tcp@{self.addr}"
        self.proc = subprocess.Popen([str(peer), "server", self.addr, registry, base, *([group] if group else [])],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            ready = sel.select(timeout=30) and self.proc.stdout.readline().startswith("ready")
        finally:
            sel.close()
        if not ready:
            self.stop()
            pytest.fail(f"the Go rpcx server ({peer.name}) did not start and register in {registry}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        finally:
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
