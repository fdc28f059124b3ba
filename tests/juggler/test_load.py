"""`juggler load` against `juggler up`: the counts reconcile (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
from array import array
from collections.abc import Iterator

import pytest
from jugglerprocs import ROOT, juggler, juggler_up

from juggler.load import LoadConfig, _percentiles, run_load

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with juggler_up() as u:
        yield u


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        LoadConfig(connections=0)
    with pytest.raises(ValueError):
        LoadConfig(payload="not json")
    with pytest.raises(ValueError):
        LoadConfig(rate=-1)


def test_percentiles() -> None:
    lat = array("q", range(1, 101))  # 1..100 µs
    p = _percentiles(lat)
    assert p["min"] == 0.001 and p["max"] == 0.1
    assert p["median"] == 0.05 and p["p99"] == 0.099 and p["p90"] == 0.09
    assert p["mean"] == pytest.approx(0.0505)
    assert _percentiles(array("q")) == {}


def test_closed_loop(url: str) -> None:
    progress: list[str] = []
    r = run_load(LoadConfig(url=url, connections=3, duration=1.5, timeout=5), progress.append)
    assert r.errors == 0, r.error_messages
    assert r.calls > 0
    assert r.acks == r.calls
    assert r.nacks == 0
    assert r.results + r.expired == r.calls
    assert r.expired == 0
    assert set(r.latency_ms) == {"min", "mean", "median", "p75", "p90", "p99", "max"}
    assert progress and "calls" in progress[0]


def test_expiring_calls_are_counted(url: str) -> None:
    r = run_load(LoadConfig(url=url, connections=2, duration=1.0, uri="test.delay", payload='"400"', timeout=0.1))
    assert r.calls > 0 and r.results == 0 and r.expired == r.calls and r.nacks == 0


def test_cli_rate_json_two_procs(url: str) -> None:
    res = subprocess.run(
        juggler("load", "--url", url, "-c", "2", "-d", "1s", "-r", "100", "--procs", "2", "--json", "--quiet"),
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["config"]["procs"] == 2
    assert r["errors"] == 0
    assert 50 <= r["calls"] <= 150
    assert r["acks"] == r["calls"] and r["results"] + r["expired"] == r["calls"]
