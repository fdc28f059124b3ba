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


def _server_frame(text: str, opcode: int = 1, fin: bool = True) -> bytes:
    data = text.encode()
    n = len(data)
    b0 = (0x80 if fin else 0) | opcode
    if n < 126:
        head = bytes((b0, n))
    elif n < 65536:
        head = bytes((b0, 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, 127)) + n.to_bytes(8, "big")
    return head + data


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(st.text(max_size=300) | st.just("x" * 70000) | st.just("y" * 126), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=20),
)
def test_load_ws_reader_reassembles_split_frames(texts: list[str], cuts: list[int]) -> None:
    """The load tool's websocket reader gets every text frame back whatever
    the TCP segmentation (the handshake included)."""
    import asyncio

    from juggler.load import _WsClient

    async def run() -> list[str]:
        got: list[str] = []
        ws = _WsClient("ws://127.0.0.1:1/ws", "juggler.0", got.append)

        class T:
            def write(self, data: bytes) -> None:
                pass

            def close(self) -> None:
                pass

            def is_closing(self) -> bool:
                return False

        ws.transport = T()  # type: ignore[assignment]
        stream = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: juggler.0\r\n\r\n"
        for t in texts:
            if len(t) > 10:  # also as two fragments
                stream += _server_frame(t[:5], 1, False) + _server_frame(t[5:], 0, True)
            else:
                stream += _server_frame(t)
        pos = 0
        for c in cuts:
            ws.data_received(stream[pos : pos + c])
            pos += c
        ws.data_received(stream[pos:])
        assert ws.opened.done()
        return got

    assert asyncio.run(run()) == texts
