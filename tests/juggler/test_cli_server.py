"""`juggler up` and `juggler server` as real subprocesses."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

import rustext
from tests.conftest import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(90)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def stop(p: subprocess.Popen) -> tuple[int, str]:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=5)
    return p.returncode, out


async def echo(url: str, text: str) -> str:
    async with connect(url, subprotocols=["juggler.0"], open_timeout=10) as ws:
        uid = rustext.new_uuid()
        await ws.send(rustext.build_call(uid, "test.echo", 5_000_000_000, json.dumps(text).encode()).decode())
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if m["meta"]["type"] == 9:
                return m["payload"]["args"]


def test_up_serves_test_callees_and_metrics_and_stops_cleanly() -> None:
    port, mport = free_port(), free_port()
    p = start("up", "--listen", f"127.0.0.1:{port}", "--metrics-port", str(mport))
    try:
        wait_for_port(port, timeout=30, proc=p)
        assert asyncio.run(echo(f"ws://127.0.0.1:{port}/ws", "héllo")) == "héllo"
        wait_for_port(mport, timeout=10, proc=p)
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'juggler_messages_read_total{type="CALL"} 1.0' in text
        assert "juggler_results_total 1.0" in text
    finally:
        code, out = stop(p)
    assert code == 0, out
    assert out.count("juggler server listening on") == 1
    assert f"ws://127.0.0.1:{port}/ws" in out and "juggler client" in out


def test_server_with_redis_and_config_file(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "juggler.toml"
    cfg.write_text(f'[server]\nlisten = "127.0.0.1:{port}"\npath = "/j"\n\n[redis]\nurl = "{redis_url}"\n')
    server = start("server", "--config", str(cfg))
    callee = start("callee", "--redis", redis_url, "--workers", "4")
    try:
        wait_for_port(port, timeout=30, proc=server)
        deadline = time.monotonic() + 30
        while True:  # the callee may still be starting: retry until it answers
            try:
                assert asyncio.run(echo(f"ws://127.0.0.1:{port}/j", "via redis")) == "via redis"
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
    finally:
        scode, sout = stop(server)
        ccode, cout = stop(callee)
    assert scode == 0, sout
    assert f"redis {redis_url}" in sout


def test_server_rejects_a_bad_config(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server]\nbogus = 1\n")
    out = subprocess.run([sys.executable, "-m", "cli", "server", "--config", str(cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bogus" in out.stderr


def test_help_has_examples() -> None:
    for cmd in ("up", "server"):
        out = subprocess.run([sys.executable, "-m", "cli", cmd, "--help"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "examples:" in out.stdout
