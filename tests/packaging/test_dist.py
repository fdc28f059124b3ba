"""The release wheel (``scripts/build-dist``) installs and runs on CPython
3.11, 3.12 and 3.13 with no Rust toolchain anywhere on ``PATH``.

For each interpreter (pyenv's, or ``python3.X`` on ``PATH``): a fresh
virtualenv, ``pip install`` of the wheel file (its dependencies from the
index, binary wheels preferred), then, from a directory outside the checkout,
``juggler --version``, ``juggler up`` on a free port and a ``test.echo`` call
through ``juggler client``: what a new user does first. The packages must be
imported from the virtualenv, never from this checkout.

The wheel is the one ``scripts/build-dist`` left in ``dist/`` (the test
command builds it before pytest). Without one the tests are skipped, or fail
under CI, where a missing wheel means the build step broke.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.netutil import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.11", "3.12", "3.13")


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _missing(what: str) -> None:
    if _ci():
        pytest.fail(what)
    pytest.skip(what)


def _version() -> str:
    with open(ROOT / "rustext" / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


@pytest.fixture(scope="module")
def wheel() -> Path:
    found = sorted(glob.glob(str(ROOT / "dist" / "juggler_suite-*-cp311-abi3-manylinux*.whl")))
    if not found:
        _missing("no wheel in dist/: run ./scripts/build-dist first")
    return Path(found[-1])


def _interpreter(version: str) -> str | None:
    """A CPython `version` executable: pyenv's newest, else python3.X on PATH."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}"),
                        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parts[-3])])
    if candidates:
        return str(candidates[-1])
    return shutil.which(f"python{version}")


def _no_rust_env(venv: Path) -> dict[str, str]:
    """The environment of a user without Rust: the virtualenv and the
    system's directories on PATH, cargo's and rustup's homes pointing nowhere."""
    keep = [d for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
            if os.path.isdir(d)]
    path = os.pathsep.join([str(venv / "bin"), *keep])
    for tool in ("cargo", "rustc", "rustup"):
        found = shutil.which(tool, path=path)
        assert found is None, f"{tool} is reachable at {found}: the test would not prove the wheel needs no Rust"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CARGO", "RUSTUP", "PYTHON", "VIRTUAL_ENV", "MATURIN"))}
    env.update(PATH=path, CARGO_HOME="/nonexistent", RUSTUP_HOME="/nonexistent", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def test_the_wheel_is_abi3_and_manylinux(wheel: Path) -> None:
    # one wheel for every CPython >= 3.11 (the stable ABI), for glibc 2.17 and newer
    tags = re.fullmatch(rf"juggler_suite-{re.escape(_version())}-cp311-abi3-(\S+)\.whl", wheel.name)
    assert tags is not None, wheel.name
    platforms = set(tags.group(1).split("."))
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64"} == platforms or \
        {"manylinux2014_aarch64", "manylinux_2_17_aarch64"} == platforms, wheel.name
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "rustext/_native.abi3.so" in names
    assert not [n for n in names if n.startswith(("rustext/src/", "tests/"))]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", VERSIONS)
def test_installs_and_serves_without_rust(wheel: Path, version: str, tmp_path: Path) -> None:
    python = _interpreter(version)
    if python is None:
        _missing(f"no CPython {version} found (pyenv or python{version} on PATH)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _no_rust_env(venv)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--prefer-binary", str(wheel)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    juggler = str(venv / "bin" / "juggler")
    home = tmp_path / "home"  # a user's working directory, nowhere near the checkout
    home.mkdir()

    version_out = subprocess.run([juggler, "--version"], env=env, cwd=home, capture_output=True, text=True,
                                 timeout=60)
    assert version_out.returncode == 0, version_out.stderr
    assert version_out.stdout.strip() == f"juggler {_version()}"

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import sys, rustext, rustext._native, juggler, cli; "
         "print(sys.version_info[:2]); print(rustext._native.__file__); print(juggler.__file__)"],
        env=env, cwd=home, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()
    assert where[0] == str(tuple(int(x) for x in version.split(".")))
    for path in where[1:]:
        assert path.startswith(str(venv)), path
    assert where[1].endswith("_native.abi3.so")

    port = free_port()
    server = subprocess.Popen([juggler, "up", "--listen", f"127.0.0.1:{port}"], env=env, cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, timeout=60, proc=server)
        session = subprocess.run(
            [juggler, "client"], env=env, cwd=home, capture_output=True, text=True, timeout=60,
            input=f'connect ws://127.0.0.1:{port}/ws\ncall 1 test.echo 5s "hello"\nexit\n',
        )
        assert session.returncode == 0, session.stdout + session.stderr
        assert re.search(r'<<< RES .*\(test\.echo\): "hello"', session.stdout), session.stdout
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert server.returncode == 0, out
    assert "juggler is up" in out
    assert "Traceback" not in out
