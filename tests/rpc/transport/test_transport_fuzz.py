"""Fuzzed streams: random and mutated input never crashes a server; the bad
connection is closed, the others keep working. Also the frame wire and the
in-process channel under arbitrary chunking."""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import pytest
import rustext
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.transport import ConnectionConfig, FrameWire, RpcxWire, TransportPool, TransportServer
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(120)


def echo(conn: Any, msg: Any) -> bytes:
    return msg.payload


@given(st.lists(st.binary(max_size=500), max_size=10), st.lists(st.integers(0, 6000), max_size=10))
@settings(max_examples=100, deadline=None)
def test_frame_wire_roundtrip_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    wire = FrameWire()
    stream = b"".join(wire.encode_request(i + 1, p, oneway=i % 2 == 1) for i, p in enumerate(payloads))
    dec = wire.decoder(ConnectionConfig())
    points = sorted({0, len(stream), *(min(c, len(stream)) for c in cuts)})
    got: list[Any] = []
    for a, b in zip(points, points[1:]):
        got += dec.feed(stream[a:b])
    assert [(m.seq, m.payload, m.oneway, m.message_type) for m in got] == [
        (i + 1, p, i % 2 == 1, 0) for i, p in enumerate(payloads)
    ]
    replies = wire.decoder(ConnectionConfig()).feed(wire.encode_replies([(m, m.payload, None) for m in got]))
    assert [(r.seq, r.payload, r.message_type) for r in replies] == [(m.seq, m.payload, 1) for m in got]


@given(st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_wires_reject_random_bytes_with_typed_errors(data: bytes) -> None:
    for wire in (FrameWire(), RpcxWire()):
        dec = wire.decoder(ConnectionConfig(max_frame=256, max_decompressed=1024))
        try:
            dec.feed(data)
        except rustext.DecodeError:
            pass


def garbage_samples(seed: int, n: int) -> list[bytes]:
    """Seeded fuzz inputs: random bytes, rpcx-looking headers with random rest,
    valid frames with a byte mutated, valid then garbage, oversized lengths."""
    rng = random.Random(seed)
    valid = rustext.RpcxMessage(seq=1, service_path="A", service_method="B", payload=b"xyz" * 5).encode()
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(rng.randbytes(rng.randint(1, 400)))
        elif kind == 1:
            out.append(b"\x08" + rng.randbytes(rng.randint(0, 400)))
        elif kind == 2:
            pos = rng.randrange(len(valid))
            out.append(valid[:pos] + bytes([rng.randrange(256)]) + valid[pos + 1 :])
        elif kind == 3:
            out.append(valid + rng.randbytes(rng.randint(1, 50)))
        else:
            out.append(valid[:12] + (2**31).to_bytes(4, "big") + b"\0" * 64)
    return out


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
async def test_fuzzed_streams_never_take_the_server_down(kind: str, inproc: Any) -> None:
    ep = "tcp://127.0.0.1:0" if kind == "tcp" else "inproc://fuzz"
    cfg = ConnectionConfig(max_frame=4096)
    from rpc.transport import ServerConfig

    samples = garbage_samples(1234, 40)
    async with TransportServer(ep, echo, inproc=inproc, config=ServerConfig(connection=cfg)) as srv:
        async with TransportPool(inproc=inproc) as pool:
            good = await pool.get(srv.endpoint)
            for blob in samples:
                if kind == "tcp":
                    r, w = await asyncio.open_connection(srv.endpoint.host, srv.endpoint.port)
                    w.write(blob)
                    await w.drain()
                    w.write_eof()
                    try:
                        await asyncio.wait_for(r.read(), 10)  # the server answers or closes
                    except (ConnectionResetError, socket.error):
                        pass
                    w.close()
                    await w.wait_closed()
                else:
                    async with TransportPool(inproc=inproc) as bad:
                        c = await bad.get(srv.endpoint)
                        assert c.transport is not None
                        c.transport.write(blob)  # then closed: the server reads it, then EOF
                # the server has read the blob and let that connection go
                await wait_until(lambda: len(srv.connections) == 1, what="the fuzzed connection closed")
                assert (await good.request(b"alive")).payload == b"alive"
