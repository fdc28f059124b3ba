"""The distribution installs and its parts import."""

import subprocess
import sys

import rustext


def test_error_tree() -> None:
    assert issubclass(rustext.DecodeError, rustext.RustextError)
    assert issubclass(rustext.DecodeError, ValueError)
    assert issubclass(rustext.FrameTooLarge, rustext.DecodeError)
    assert issubclass(rustext.BalancerConfigError, ValueError)
    assert not issubclass(rustext.BalancerError, ValueError)


def test_redis_fixture(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_cli_help_runs_as_subprocess() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert "juggler" in out.stdout


def test_the_extension_is_the_stable_abi_build() -> None:
    """One build serves every CPython >= 3.11 (the wheels' abi3); a stale
    version-specific module beside it would be imported first."""
    assert rustext._native.__file__.endswith("_native.abi3.so"), rustext._native.__file__
