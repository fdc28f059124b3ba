"""`pip install .` gives a distribution that works from any directory,
the root of a source checkout included.

Takes the release wheel (or builds one with maturin), installs it without
dependencies into a scratch target, and imports
every package and runs the console script from a directory outside the
checkout, with the scratch target first on the path; then from a copy of the
checkout's files (a fresh clone: no compiled module in it), where
``python -m``/``-c`` put the source packages first and shadow the installed
ones, commands that start children included.
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


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, installed (without dependencies) into a scratch target: the
    release wheel of ``scripts/build-dist`` when ``dist/`` has one (the test
    command builds it), else one built here with maturin."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    release = sorted((ROOT / "dist").glob("juggler_suite-*-cp311-abi3-*.whl"))
    if release:
        wheel = release[-1]
    else:
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
    return target


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_and_runs_outside_checkout(installed: Path, tmp_path: Path) -> None:
    target = installed
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runs_from_the_root_of_a_fresh_checkout(installed: Path, tmp_path: Path) -> None:
    target = installed
    src = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    assert not list((src / "rustext").glob("_native*.so"))  # as in a fresh clone
    env = {**os.environ, "PYTHONPATH": str(target)}
    # python -c puts the checkout first: its rustext has no compiled module, the installed one's is found
    code = f"import juggler.client, rustext; assert rustext._native.__file__.startswith({str(target)!r})"
    subprocess.run([sys.executable, "-c", code], cwd=src, env=env, check=True, timeout=60)
    script = str(target / "bin" / "juggler")
    for args in (
        ["--version"],
        ["rpc", "transport-bench", "--duration", "0.3", "--no-raw"],  # a `python -m` child
        ["seq", "bench", "--duration", "0.3", "--clients", "2"],  # three `python -m cli` members
    ):
        done = subprocess.run([script, *args], cwd=src, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"juggler {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
