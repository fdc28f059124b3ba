"""Building the Go rpcx peers of the interop tests (``tests/rpc/interop/*``,
each its own Go module) into a temporary directory.

The build needs ``go`` and the Go module proxy (or a warm module cache).
Without ``go`` the interop tests are skipped on a developer's machine and
fail in CI (``CI=true``), where interop must never go untested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

INTEROP = Path(__file__).parent / "interop"


def build_go_peer(tmp_path_factory: pytest.TempPathFactory, module: str, what: str) -> Path:
    """Build ``tests/rpc/interop/{module}`` and return the binary; ``what``
    names the peer in the skip/fail message ("the rpcx-etcd interop peer")."""
    go = shutil.which("go")
    if go is None:
        why = f"Go is not installed: {what} cannot be built"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{why} (in CI the interop tests must run)")
        pytest.skip(why)
    out = tmp_path_factory.mktemp(module) / module
    res = subprocess.run([go, "build", "-o", str(out), "."], cwd=INTEROP / module, capture_output=True, text=True,
                         timeout=600, check=False, env={**os.environ, "CGO_ENABLED": "0"})
    assert res.returncode == 0, f"go build of {INTEROP / module} failed:\n{res.stderr}"
    return out
