"""`pip install .` gives a distribution that works from any directory.

Builds the wheel with maturin (reusing the release build of the editable
install), installs it without dependencies into a scratch target, and imports
every package and runs the console script from a directory outside the
checkout, with the scratch target first on the path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rustext", "juggler", "balancer", "rpc", "seq", "cli")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_and_runs_outside_checkout(tmp_path: Path) -> None:
    maturin = shutil.which("maturin") or str(Path(sys.executable).with_name("maturin"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [maturin, "build", "--release", "--quiet", "-o", str(wheels)],
        cwd=ROOT, check=True, timeout=880, capture_output=True,
    )
    (wheel,) = wheels.glob("*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True, timeout=120,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import importlib, sys\n"
        f"for name in {PACKAGES!r}:\n"
        "    mod = importlib.import_module(name)\n"
        f"    assert mod.__file__.startswith({str(target)!r}), (name, mod.__file__)\n"
        "import rustext._native\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=60)
    out = subprocess.run(
        [str(target / "bin" / "juggler"), "--help"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: juggler" in out.stdout
