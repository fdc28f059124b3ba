"""`juggler rpc transport-bench` runs end to end (tiny durations: behaviour, not speed)."""

from __future__ import annotations

import json

import pytest

from cli.main import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("channel", ["tcp", "unix"])
def test_transport_bench_json(channel: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["rpc", "transport-bench", "--payload", "2048", "--inflight", "2", "--duration", "0.3", "--channel", channel, "--json"])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in rows] == ["transport", "raw"]
    for r in rows:
        assert r["channel"] == channel and r["payload"] == 2048 and r["inflight"] == 2
        assert r["requests"] > 0 and r["rps"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0


def test_transport_bench_table_frame_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc", "transport-bench", "--payload", "100", "--inflight", "1", "--duration", "0.2", "--protocol", "frame", "--no-raw"]) == 0
    out = capsys.readouterr().out
    assert "| transport | tcp |" in out and "| raw |" not in out


def test_rpc_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc"]) == 2
    assert "transport-bench" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["rpc", "transport-bench", "--help"])
    assert exc.value.code == 0
    assert main(["rpc", "transport-bench", "--inflight", "0"]) == 2
