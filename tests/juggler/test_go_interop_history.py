"""History next to the original Go server, live: both servers on one Redis.

Runs when ``JUGGLER_GO_SERVER`` names a ``juggler-server`` binary built from
the original (PuerkitoBio/juggler with mna/redisc; neither is on the Go
module proxy, so CI machines cannot build it and the test is skipped there).
A Go server's subscribers get our history publications as ordinary events;
our subscribers get the Go server's publications without a position; history
recovery works beside it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
from jugglerprocs import juggler_server

from juggler.client import connect

GO_SERVER = os.environ.get("JUGGLER_GO_SERVER")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not GO_SERVER, reason="JUGGLER_GO_SERVER (an original juggler-server binary) is not set"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_history_beside_the_original_server(redis_url: str, tmp_path: object) -> None:
    from pathlib import Path

    assert GO_SERVER is not None
    redis_addr = redis_url.removeprefix("redis://").split("/")[0]
    port = _free_port()
    go = subprocess.Popen([GO_SERVER, "-port", str(port), "-redis", redis_addr, "-L"])
    config = Path(str(tmp_path)) / "h.toml"
    config.write_text('[[channels]]\nmatch = "h.*"\nhistory_size = 50\n')
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the Go server did not start"
                time.sleep(0.05)
        go_url = f"ws://127.0.0.1:{port}/ws"
        with juggler_server(redis_url, "--config", str(config)) as ours:
            async with connect(go_url) as go_sub, connect(ours) as our_sub, connect(ours) as our_pub, \
                    connect(go_url) as go_pub:
                await go_sub.sub("h.x")
                ack = await our_sub.sub("h.x")
                await our_pub.pub("h.x", {"from": "ours"})
                got = await go_sub.next_event(5)
                assert got.args == {"from": "ours"} and got.offset is None  # the Go server's own EVNT
                mine = await our_sub.next_event(5)
                assert mine.offset == 1 and mine.epoch == ack["epoch"]
                await go_pub.pub("h.x", {"from": "go"})
                assert (await go_sub.next_event(5)).args == {"from": "go"}
                theirs = await our_sub.next_event(5)
                assert theirs.args == {"from": "go"} and theirs.offset is None
                async with connect(ours) as back:
                    assert (await back.sub("h.x", since=(0, ack["epoch"])))["recovered"] is True
                    assert (await back.next_event(5)).args == {"from": "ours"}
    finally:
        go.terminate()
        go.wait(10)
