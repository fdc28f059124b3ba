"""The juggler server against real websockets clients (the `websockets` library).

Most tests run the in-memory broker with the test callees in-process; the
Redis ones use the real redis-server of the `redis_url` fixture.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from test_wsproto import REQUEST, masked
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import rustext
from juggler.broker.memory import MemoryBroker
from juggler.callee import Callee, make_test_app
from juggler.config import ServerConfig
from juggler.conn import Conn, ConnState
from juggler.protocol import Outgoing
from juggler.server import Server
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

SECOND = 1_000_000_000


@asynccontextmanager
async def stack(
    broker: Any = None, *, callees: bool = True, **server_kw: Any
) -> AsyncIterator[Server]:
    cfg_kw = {k: server_kw.pop(k) for k in list(server_kw) if k in ServerConfig.__dataclass_fields__}
    broker = broker or MemoryBroker()
    await broker.start()
    callee = None
    server = Server(broker, ServerConfig(port=0, **cfg_kw), **server_kw)
    try:
        await server.start()
        if callees:
            callee = Callee(broker, make_test_app(), workers=20)
            await callee.start()
        yield server
    finally:
        await server.aclose()
        if callee is not None:
            await callee.aclose()
        await broker.aclose()


def ws(server: Server, subprotocols: list[str] | None = None, **kw: Any) -> Any:
    kw.setdefault("compression", None)
    kw.setdefault("ping_interval", None)
    if subprotocols is None:
        subprotocols = ["juggler.0"]
    return connect(server.url, subprotocols=subprotocols or None, open_timeout=10, close_timeout=2, **kw)


async def recv(c: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    text = await asyncio.wait_for(c.recv(), timeout)
    assert isinstance(text, str) and text.endswith("\n")
    return json.loads(text)


async def assert_dropped(c: ClientConnection, timeout: float = 5.0) -> None:
    """The server closed the connection without a close frame and without a message."""
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(c.recv(), timeout)
    assert info.value.rcvd is None


def call(uri: str, args: Any = None, timeout_ns: int = 5 * SECOND, *, uid: str | None = None) -> tuple[str, str]:
    uid = uid or rustext.new_uuid()
    raw = None if args is None else json.dumps(args).encode()
    return uid, rustext.build_call(uid, uri, timeout_ns, raw).decode()


async def test_call_ack_then_res() -> None:
    async with stack() as server, ws(server) as c:
        uid, frame = call("test.echo", "hello")
        await c.send(frame)
        ack = await recv(c)
        assert ack["meta"]["type"] == 8 and ack["payload"] == {"for": uid, "for_type": 1, "uri": "test.echo"}
        res = await recv(c)
        assert res["meta"]["type"] == 9
        assert res["payload"] == {"for": uid, "uri": "test.echo", "args": "hello"}
        assert len({ack["meta"]["uuid"], res["meta"]["uuid"], uid}) == 3
        assert c.subprotocol == "juggler.0"


async def test_acks_in_request_order_and_all_results() -> None:
    async with stack() as server, ws(server) as c:
        uids = []
        for i in range(50):
            uid, frame = call("test.reverse" if i % 2 else "test.echo", f"msg-{i}")
            uids.append(uid)
            await c.send(frame)
        acks, results = [], {}
        while len(acks) < 50 or len(results) < 50:
            m = await recv(c)
            if m["meta"]["type"] == 8:
                acks.append(m["payload"]["for"])
            else:
                results[m["payload"]["for"]] = m["payload"]["args"]
        assert acks == uids
        for i, uid in enumerate(uids):
            assert results[uid] == (f"msg-{i}"[::-1] if i % 2 else f"msg-{i}")


async def test_timeouts_default_expiry_and_negative() -> None:
    async with stack() as server, ws(server) as c:
        # 0 and sub-millisecond timeouts mean the 1-minute default: the call runs
        for t in (0, 999_999):
            uid, frame = call("test.echo", "x", t)
            await c.send(frame)
            assert (await recv(c))["meta"]["type"] == 8
            assert (await recv(c))["payload"]["for"] == uid
        # an expired call: ACK only, never a RES
        uid, frame = call("test.delay", "300", 100_000_000)
        await c.send(frame)
        assert (await recv(c))["meta"]["type"] == 8
        with pytest.raises(TimeoutError):
            await recv(c, timeout=0.6)
        # a negative timeout: NACK 500
        uid, frame = call("test.echo", "neg", -1_000_000)
        await c.send(frame)
        nack = await recv(c)
        assert nack["meta"]["type"] == 7
        p = nack["payload"]
        assert (p["for"], p["for_type"], p["uri"], p["code"]) == (uid, 1, "test.echo", 500)
        assert "timeout" in p["message"]


async def test_callee_errors_come_as_results_and_args_absent() -> None:
    async with stack() as server, ws(server) as c:
        uid, frame = call("test.delay", "abc")
        await c.send(frame)
        await recv(c)
        res = await recv(c)
        assert "error" in res["payload"]["args"]
        uid, frame = call("test.echo")  # no args at all
        assert '"args"' not in frame
        await c.send(frame)
        await recv(c)
        assert "error" in (await recv(c))["payload"]["args"]


async def test_uppercase_uuid_is_echoed_lower_case() -> None:
    async with stack() as server, ws(server) as c:
        uid = rustext.new_uuid()
        _, frame = call("test.echo", "upper", uid=uid.upper())
        await c.send(frame)
        assert (await recv(c))["payload"]["for"] == uid
        assert (await recv(c))["payload"]["for"] == uid


async def test_capacity_exceeded_is_nack_500() -> None:
    async with stack(MemoryBroker(call_cap=2, refuse_unserved=False), callees=False) as server, ws(server) as c:
        for _ in range(2):
            await c.send(call("nobody.serves", 1)[1])
            assert (await recv(c))["meta"]["type"] == 8
        uid, frame = call("nobody.serves", 1)
        await c.send(frame)
        nack = await recv(c)
        assert nack["meta"]["type"] == 7
        assert nack["payload"]["code"] == 500 and nack["payload"]["message"] == "list capacity exceeded"


async def test_pubsub_channel_and_pattern_double_delivery() -> None:
    async with stack(callees=False) as server, ws(server) as sub, ws(server) as pub:
        for ch, pat in (("cap.news.a", False), ("cap.news.*", True), ("cap.news.a", False)):
            await sub.send(rustext.build_sub(rustext.new_uuid(), ch, pat).decode())
            ack = await recv(sub)
            assert ack["payload"]["for_type"] == 3 and ack["payload"]["channel"] == ch
        uid = rustext.new_uuid()
        await pub.send(rustext.build_pub(uid, "cap.news.a", b'{"x":1}').decode())
        ack = await recv(pub)
        assert ack["payload"] == {"for": uid, "for_type": 2, "channel": "cap.news.a"}
        evs = [await recv(sub), await recv(sub)]
        assert all(e["meta"]["type"] == 10 and e["payload"]["for"] == uid for e in evs)
        assert sorted(e["payload"].get("pattern", "") for e in evs) == ["", "cap.news.*"]
        assert all(e["payload"]["args"] == {"x": 1} for e in evs)
        # PUB without args: EVNT carries args null
        uid = rustext.new_uuid()
        await pub.send(rustext.build_pub(uid, "cap.news.b").decode())
        await recv(pub)
        ev = await recv(sub)
        assert ev["payload"] == {"for": uid, "channel": "cap.news.b", "pattern": "cap.news.*", "args": None}
        # one UNSB removes the (twice subscribed) channel
        for ch, pat in (("cap.news.a", False), ("cap.news.*", True), ("cap.never", False)):
            await sub.send(rustext.build_unsb(rustext.new_uuid(), ch, pat).decode())
            assert (await recv(sub))["payload"]["for_type"] == 4
        await pub.send(rustext.build_pub(rustext.new_uuid(), "cap.news.a", b"1").decode())
        await recv(pub)
        with pytest.raises(TimeoutError):
            await recv(sub, timeout=0.3)


async def test_closing_a_subscriber_releases_its_subscriptions() -> None:
    broker = MemoryBroker()
    async with stack(broker, callees=False) as server:
        async with ws(server) as sub:
            await sub.send(rustext.build_sub(rustext.new_uuid(), "a", False).decode())
            await recv(sub)
            assert broker.stats.redis_subscriptions == 1
        await wait_until(lambda: broker.stats.redis_subscriptions == 0, what="the subscription released")
        assert server.stats.connections_active == 0


@pytest.mark.parametrize(
    "frame",
    [
        "this is not json",
        "",
        '{"meta": {"type": 99, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}',
        '{"meta": {"type": 8, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {"for": "x"}}',
        '{"meta": {"type": "CALL", "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}',
        '{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","timeout":1.5e9}}',
        '{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","timeout":"5s"}}',
        '{"meta": {"type": 1, "uuid": "not-a-uuid"}, "payload": {"uri": "test.echo"}}',
        '{"meta": {"type": 1, "uuid": "1c597308-ad4c-4744-af8f-568895b2b65e"}}',
        b'{"meta":{"type":1}}',  # binary frame
    ],
)
async def test_bad_input_closes_only_that_connection(frame: str | bytes) -> None:
    async with stack() as server, ws(server) as good, ws(server) as bad:
        await bad.send(frame)
        await assert_dropped(bad)
        uid, f = call("test.echo", "still here")
        await good.send(f)
        assert (await recv(good))["payload"]["for"] == uid
        assert (await recv(good))["payload"]["args"] == "still here"
        assert server.stats.protocol_errors == 1


async def test_replies_before_bad_input_are_sent() -> None:
    async with stack() as server, ws(server) as c:
        uid, f = call("test.echo", "first")
        await c.send(f)
        await c.send("garbage")
        ack = await recv(c)
        assert ack["meta"]["type"] == 8 and ack["payload"]["for"] == uid
        # the RES may or may not make it before the close; then the connection is dropped
        with pytest.raises(ConnectionClosed):
            for _ in range(3):
                await recv(c)


async def test_two_json_values_in_one_frame_processes_the_first() -> None:
    async with stack() as server, ws(server) as c:
        uid1, f1 = call("test.echo", "first")
        _, f2 = call("test.echo", "second")
        await c.send(f1 + f2)
        assert (await recv(c))["payload"]["for"] == uid1
        assert (await recv(c))["payload"]["args"] == "first"
        with pytest.raises(TimeoutError):
            await recv(c, timeout=0.3)


async def test_subprotocol_negotiation() -> None:
    async with stack() as server:
        async with ws(server, ["foo", "juggler.0"]) as c:
            assert c.subprotocol == "juggler.0"
            await c.send(call("test.echo", "ok")[1])
            await recv(c)
        for offered in ([], ["juggler.1"]):
            async with ws(server, offered) as c:
                assert c.subprotocol is None
                await assert_dropped(c)


async def test_allow_empty_subprotocol_option() -> None:
    async with stack(allow_empty_subprotocol=True) as server:
        async with ws(server, []) as c:
            await c.send(call("test.echo", "ok")[1])
            assert (await recv(c))["meta"]["type"] == 8
        async with ws(server, ["juggler.1"]) as c:  # a wrong one is still refused
            await assert_dropped(c)


async def test_allowed_messages_header() -> None:
    async with stack() as server:
        async with ws(server, additional_headers={"Juggler-Allowed-Messages": "call, pub"}) as c:
            await c.send(call("test.echo", "allowed")[1])
            assert (await recv(c))["meta"]["type"] == 8
            assert (await recv(c))["meta"]["type"] == 9
            await c.send(rustext.build_pub(rustext.new_uuid(), "cap.allowed", b"1").decode())
            assert (await recv(c))["payload"]["for_type"] == 2
            await c.send(rustext.build_sub(rustext.new_uuid(), "cap.allowed").decode())
            await assert_dropped(c)
        with pytest.raises(InvalidStatus) as info:
            async with ws(server, additional_headers={"Juggler-Allowed-Messages": "call, bogus"}):
                pass
        assert info.value.response.status_code == 400


async def test_wrong_path_is_404() -> None:
    async with stack(callees=False) as server:
        url = server.url.replace("/ws", "/nope")
        with pytest.raises(InvalidStatus) as info:
            async with connect(url, subprotocols=["juggler.0"], open_timeout=5):
                pass
        assert info.value.response.status_code == 404


async def test_read_limit_closes_with_1009() -> None:
    async with stack(read_limit=1000) as server, ws(server, max_size=None) as c:
        await c.send(call("test.echo", "x" * 2000)[1])
        with pytest.raises(ConnectionClosed) as info:
            await recv(c)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_write_limit_closes_the_connection() -> None:
    async with stack(write_limit=500) as server, ws(server) as c:
        uid, f = call("test.echo", "y" * 1000)  # the RES is too big to send
        await c.send(f)
        assert (await recv(c))["meta"]["type"] == 8
        with pytest.raises(ConnectionClosed) as info:
            await recv(c)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_read_timeout_closes_idle_connections() -> None:
    async with stack(read_timeout=0.3, callees=False) as server, ws(server) as c:
        with pytest.raises(ConnectionClosed):
            await recv(c, timeout=5)


async def test_middleware_sees_both_directions_and_can_nack() -> None:
    seen: list[tuple[str, int]] = []

    async def auth(conn: Conn, msg: Any, nxt: Any) -> None:
        if isinstance(msg, Outgoing):
            seen.append(("out", msg.type))
        else:
            seen.append(("in", msg.type))
            if msg.type == rustext.CALL and msg.uri == "secret":
                conn.nack(msg, 403, "forbidden")
                return
        await nxt(conn, msg)

    async with stack(middleware=[auth]) as server, ws(server) as c:
        uid, f = call("secret", 1)
        await c.send(f)
        nack = await recv(c)
        assert nack["meta"]["type"] == 7
        assert nack["payload"]["code"] == 403 and nack["payload"]["message"] == "forbidden"
        await c.send(call("test.echo", "ok")[1])
        assert (await recv(c))["meta"]["type"] == 8
        assert (await recv(c))["meta"]["type"] == 9
    assert seen[0] == ("in", 1) and ("out", 7) in seen and ("out", 8) in seen and ("out", 9) in seen


async def test_handler_exception_closes_only_the_faulty_connection() -> None:
    async def explode(conn: Conn, msg: Any, nxt: Any) -> None:
        if not isinstance(msg, Outgoing) and msg.type == rustext.PUB:
            raise RuntimeError("boom")
        await nxt(conn, msg)

    async with stack(middleware=[explode]) as server, ws(server) as good, ws(server) as bad:
        await bad.send(rustext.build_pub(rustext.new_uuid(), "c", b"1").decode())
        with pytest.raises(ConnectionClosed) as info:
            await recv(bad)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1011
        await good.send(call("test.echo", "fine")[1])
        assert (await recv(good))["meta"]["type"] == 8
        assert server.stats.recovered == 1


async def test_conn_state_callbacks() -> None:
    states: list[ConnState] = []
    refuse = False

    def on_state(conn: Conn, state: ConnState) -> None:
        states.append(state)
        if refuse and state is ConnState.ACCEPTING:
            raise PermissionError("no")

    async with stack(on_conn_state=on_state, callees=False) as server:
        async with ws(server):
            pass
        await wait_until(lambda: ConnState.CLOSED in states, what="the connection CLOSED")
        assert states == [ConnState.ACCEPTING, ConnState.CONNECTED, ConnState.CLOSED]
        refuse = True
        with pytest.raises(InvalidStatus) as info:
            async with ws(server):
                pass
        assert info.value.response.status_code == 403


async def test_slow_messages_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def slow(conn: Conn, msg: Any, nxt: Any) -> None:
        if not isinstance(msg, Outgoing):
            await asyncio.sleep(0.1)
        await nxt(conn, msg)

    async with stack(middleware=[slow], slow_threshold=0.05) as server, ws(server) as c:
        await c.send(call("test.echo", "x")[1])
        await recv(c)
        assert server.stats.slow_messages == 1
    assert any("slow message" in r.getMessage() for r in caplog.records)


async def test_shutdown_closes_connections_with_1001() -> None:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0))
    await server.start()
    async with ws(server) as c:
        await server.aclose()
        with pytest.raises(ConnectionClosed) as info:
            await recv(c)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    await server.aclose()  # idempotent
    await broker.aclose()


async def test_many_connections_concurrently() -> None:
    async with stack() as server:
        async def one(i: int) -> None:
            async with ws(server) as c:
                for j in range(10):
                    uid, f = call("test.echo", f"{i}-{j}")
                    await c.send(f)
                    got = {}
                    while len(got) < 2:
                        m = await recv(c)
                        got[m["meta"]["type"]] = m
                    assert got[9]["payload"] == {"for": uid, "uri": "test.echo", "args": f"{i}-{j}"}

        await asyncio.gather(*(one(i) for i in range(30)))
        assert server.stats.calls == 300 and server.stats.results == 300
        assert server.pending_calls == 0


async def test_with_redis_broker(redis_url: str) -> None:
    from juggler.broker.redis import RedisBroker, RedisBrokerConfig

    async with stack(RedisBroker(RedisBrokerConfig(url=redis_url))) as server:
        async with ws(server) as sub, ws(server) as c:
            uid, f = call("test.reverse", "héllo")
            await c.send(f)
            assert (await recv(c))["meta"]["type"] == 8
            res = await recv(c)
            assert res["payload"] == {"for": uid, "uri": "test.reverse", "args": "olléh"}
            await sub.send(rustext.build_sub(rustext.new_uuid(), "r.*", True).decode())
            await recv(sub)
            pid = rustext.new_uuid()
            await c.send(rustext.build_pub(pid, "r.x", b'"hi"').decode())
            assert (await recv(c))["meta"]["type"] == 8
            ev = await recv(sub)
            assert ev["payload"] == {"for": pid, "channel": "r.x", "pattern": "r.*", "args": "hi"}
            # an expired call through Redis: no RES
            await c.send(call("test.delay", "300", 100_000_000)[1])
            assert (await recv(c))["meta"]["type"] == 8
            with pytest.raises(TimeoutError):
                await recv(c, timeout=0.6)
            # negative timeout → NACK 500
            await c.send(call("test.echo", "x", -1_000_000)[1])
            assert (await recv(c))["meta"]["type"] == 7


async def test_raw_redis_publish_reaches_subscribers(redis_url: str) -> None:
    import redis.asyncio as aioredis

    from juggler.broker.redis import RedisBroker, RedisBrokerConfig

    async with stack(RedisBroker(RedisBrokerConfig(url=redis_url)), callees=False) as server, ws(server) as sub:
        await sub.send(rustext.build_sub(rustext.new_uuid(), "cap.raw").decode())
        await recv(sub)
        r = aioredis.Redis.from_url(redis_url)
        try:
            x = rustext.new_uuid()
            await r.publish("cap.raw", json.dumps({"msg_uuid": x, "args": {"from": "redis"}}))
        finally:
            await r.aclose()
        ev = await recv(sub)
        assert ev["payload"] == {"for": x, "channel": "cap.raw", "args": {"from": "redis"}}


def _transcript(shared_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(shared_dir, "vectors", "juggler", "transcript.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


async def test_replay_capture_rpc_scenarios(shared_dir: str) -> None:
    """Every RPC client frame of the capture gets the same kinds of replies from us."""
    rows = [r for r in _transcript(shared_dir) if r["conn"] == "c1"]
    # the capture's server queued calls to unknown URIs until they expired, as Redis does
    async with stack(MemoryBroker(refuse_unserved=False)) as server, ws(server) as c:
        for scenario in dict.fromkeys(r["scenario"] for r in rows):
            sent = [r["frame"] for r in rows if r["scenario"] == scenario and r["direction"] == "client->server"]
            expected = [json.loads(r["frame"]) for r in rows
                        if r["scenario"] == scenario and r["direction"] == "server->client"]
            for frame in sent:
                await c.send(frame)
            got = []
            for _ in expected:
                got.append(await recv(c))
            key = lambda m: (m["meta"]["type"], m["payload"]["for"])  # noqa: E731
            assert sorted(map(key, got)) == sorted(map(key, expected)), scenario
            by_key = {key(m): m for m in got}
            for exp in expected:
                ours = by_key[key(exp)]["payload"]
                theirs = exp["payload"]
                assert set(ours) == set(theirs), scenario
                if "args" in theirs and "error" not in json.dumps(theirs["args"]):
                    assert ours["args"] == theirs["args"], scenario
            if scenario == "call_delay_expired":
                with pytest.raises(TimeoutError):
                    await recv(c, timeout=0.7)


async def test_replay_capture_protocol_errors(shared_dir: str) -> None:
    errors = {"binary_frame", "invalid_json", "unknown_type", "server_type_from_client", "string_type",
              "float_timeout", "string_timeout", "invalid_uuid", "missing_payload"}
    rows = [r for r in _transcript(shared_dir) if r["scenario"] in errors]
    async with stack() as server, ws(server) as bystander:
        for r in rows:
            if r["direction"] == "client->server":
                frame: str | bytes = r["frame"]
            elif r["direction"] == "client->server:binary":
                frame = bytes.fromhex(r["frame"])
            else:
                continue
            async with ws(server) as c:
                await c.send(frame)
                await assert_dropped(c)
        await bystander.send(call("test.echo", "alive")[1])
        assert (await recv(bystander))["meta"]["type"] == 8
        assert server.stats.protocol_errors == len(errors)


async def test_backpressure_keeps_order_with_a_tiny_inbox() -> None:
    async with stack(max_pending=2) as server, ws(server) as c:
        uids = []
        for i in range(100):
            uid, f = call("test.echo", i)
            uids.append(uid)
            await c.send(f)
        acks, res = [], 0
        while len(acks) < 100 or res < 100:
            m = await recv(c)
            if m["meta"]["type"] == 8:
                acks.append(m["payload"]["for"])
            else:
                res += 1
        assert acks == uids


async def test_ping_pong_and_fragmented_messages() -> None:
    async with stack() as server, ws(server) as c:
        pong = await c.ping(b"hello")
        await asyncio.wait_for(pong, 5)
        uid, f = call("test.echo", "fragmented " * 50)
        await c.send([f[:10], f[10:200], f[200:]])  # one message in three frames
        assert (await recv(c))["payload"]["for"] == uid
        assert (await recv(c))["payload"]["args"] == "fragmented " * 50


@pytest.mark.parametrize(
    "raw,code",
    [
        (b"\xc1\x80abcd", 1002),  # RSV1 set (no extension negotiated)
        (b"\x81\x05hello", 1002),  # unmasked client frame
        (b"\x83\x80abcd", 1002),  # reserved opcode
        (b"\x09\x80abcd", 1002),  # fragmented ping
        (b"\x80\x80abcd", 1002),  # continuation without a start
        (b"\x81\xff" + (2**40).to_bytes(8, "big") + b"abcd", 1009),  # declared length over read_limit
    ],
)
async def test_frame_protocol_errors_close_only_that_connection(raw: bytes, code: int) -> None:
    async with stack() as server, ws(server) as good, ws(server) as bad:
        bad.transport.write(raw)
        with pytest.raises(ConnectionClosed) as info:
            await recv(bad)
        assert info.value.rcvd is not None and info.value.rcvd.code == code
        await good.send(call("test.echo", "ok")[1])
        assert (await recv(good))["meta"]["type"] == 8


async def test_a_call_uuid_in_use_by_another_connection_is_refused() -> None:
    async with stack() as server, ws(server) as a, ws(server) as b:
        uid, f = call("test.delay", "300")
        await a.send(f)
        assert (await recv(a))["meta"]["type"] == 8
        await b.send(call("test.echo", "steal", uid=uid)[1])  # same uuid, other connection
        nack = await recv(b)
        assert nack["meta"]["type"] == 7 and nack["payload"]["message"] == "duplicate message uuid"
        res = await recv(a)  # the result still goes to the caller
        assert res["payload"] == {"for": uid, "uri": "test.delay", "args": 300}


async def test_subscriptions_per_connection_are_capped() -> None:
    async with stack(max_subscriptions=2, callees=False) as server, ws(server) as c:
        for ch in ("a", "b", "a"):  # re-subscribing counts once
            await c.send(rustext.build_sub(rustext.new_uuid(), ch).decode())
            assert (await recv(c))["meta"]["type"] == 8
        await c.send(rustext.build_sub(rustext.new_uuid(), "c").decode())
        nack = await recv(c)
        assert nack["meta"]["type"] == 7 and "too many subscriptions" in nack["payload"]["message"]
        await c.send(rustext.build_unsb(rustext.new_uuid(), "a").decode())
        await recv(c)
        await c.send(rustext.build_sub(rustext.new_uuid(), "c").decode())
        assert (await recv(c))["meta"]["type"] == 8


async def test_frames_sent_with_the_handshake_are_read() -> None:
    """Frames a client sends with the upgrade request, without waiting for the
    101, are read: a whole one and the first fragment of a message whose
    continuation comes later."""
    whole, whole_frame = call("test.echo", "with the handshake")
    frag, frag_frame = call("test.echo", "split over the switch")
    request = REQUEST
    first, rest = frag_frame.encode()[:20], frag_frame.encode()[20:]
    async with stack() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(request + masked(whole_frame.encode()) + masked(first, fin=False))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 101")
            writer.write(masked(rest, opcode=0))
            acked: list[str] = []
            while len(acked) < 2:
                b0, b1 = await asyncio.wait_for(reader.readexactly(2), 5)
                assert b0 == 0x81  # unfragmented text frames from the server
                n = b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(await reader.readexactly(2), "big")
                msg = json.loads(await reader.readexactly(n))
                if msg["meta"]["type"] == 8:
                    acked.append(msg["payload"]["for"])
            assert acked == [whole, frag]
        finally:
            writer.close()
            await writer.wait_closed()


async def test_a_frame_split_across_the_handshake_read_is_read() -> None:
    """A frame that starts in the read carrying the upgrade request and ends
    in a later read is one frame, not a protocol error (a client that does
    not wait for the 101)."""
    uuid, frame = call("test.echo", "split inside one frame")
    request = REQUEST
    data = masked(frame.encode())
    async with stack() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(request + data[:9])  # header, mask and 1 payload byte
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 101")
            writer.write(data[9:])
            while True:
                b0, b1 = await asyncio.wait_for(reader.readexactly(2), 5)
                assert b0 == 0x81, f"server sent opcode {b0 & 0x0F} (8 is a close)"
                n = b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(await reader.readexactly(2), "big")
                msg = json.loads(await reader.readexactly(n))
                if msg["meta"]["type"] == 8:
                    assert msg["payload"]["for"] == uuid
                    break
        finally:
            writer.close()
            await writer.wait_closed()
