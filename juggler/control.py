"""The control plane: how the servers sharing one Redis act as one for the server API.

Every server process on a Redis broker runs one :class:`Control`, whether or
not it serves the HTTP API itself (``juggler.api``), so that a command given
to any server reaches the connections of all of them:

- each server announces itself every ``heartbeat_interval`` s (a heartbeat:
  id, name, version); the others keep a :class:`NodeRegistry` and forget a
  server whose heartbeats stop for ``3 × heartbeat_interval`` s, or at once
  when it leaves cleanly. A server that starts says hello and the others
  answer it straight away, so it knows them without waiting a period;
- :meth:`Control.request` runs one operation (``info``, ``channels``,
  ``disconnect``, ``unsubscribe``, ``subscribe``: :class:`NodeOps`) on every server: it is
  broadcast, each server runs it on its own connections and replies to the
  requester's inbox, and the requester waits for every server its registry
  knows, for up to ``timeout`` s. Servers that did not answer in time are
  named in the outcome (:attr:`Survey.missing`), never waited for longer.

Channels: Redis 7 sharded pub-sub (``SPUBLISH``/``SSUBSCRIBE``). Shard
channels are a namespace of their own: the PUBLISH, SUBSCRIBE and PSUBSCRIBE
of juggler clients (and of the original Go server) can neither see nor forge
control messages, whatever the channel names. They travel on
:class:`juggler.broker.redis.sharded.ShardedPubSub` (reconnects, cluster slot
moves); the hash tag puts every control channel in one Redis Cluster slot, so
one connection to one node carries a server's control subscriptions:

- ``{juggler.control}``             broadcast: heartbeats, leaves, requests
- ``{juggler.control}.<node id>``   one server's inbox: replies, answers to a hello

Messages are JSON objects, ``"v": 1``, each naming its sender's node
(``{"id", "name", "version"}``); any message refreshes its sender's entry::

    {"v":1,"type":"heartbeat","node":{…},"hello":true}      hello: answer me
    {"v":1,"type":"leave","node":{…}}
    {"v":1,"type":"request","node":{…},"id":"<uuid>","op":"disconnect","params":{…}}
    {"v":1,"type":"reply","node":{…},"id":"<uuid>","result":{…}}   or "error":"…"

A message that is not one of these (another version, a malformed one) is
dropped and logged at debug level.

With the in-memory broker there is one server: a :class:`Control` without
Redis runs every request on this server alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import rustext
from juggler.auth import user_of
from juggler.broker.base import BrokerError

__all__ = [
    "BROADCAST",
    "Control",
    "ControlError",
    "NodeOps",
    "NodeRegistry",
    "NodeReply",
    "Survey",
    "decode_message",
    "encode_message",
    "glob_filter",
    "inbox",
    "package_version",
]

log = logging.getLogger("juggler.control")

#: the broadcast channel (a Redis shard channel)
BROADCAST = "{juggler.control}"
#: message format version
VERSION = 1
#: seconds between heartbeats (a server is forgotten after three missed ones)
HEARTBEAT_INTERVAL = 2.0
_TYPES = frozenset({"heartbeat", "leave", "request", "reply"})


def package_version() -> str:
    """The installed juggler's version (as ``juggler --version`` shows it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("juggler-suite")
    except PackageNotFoundError:
        return "unknown"


def inbox(node_id: str) -> str:
    """The shard channel of one server's inbox (same slot as :data:`BROADCAST`)."""
    return f"{BROADCAST}.{node_id}"


class ControlError(BrokerError):
    """The control plane could not be set up or reach the other servers."""

    code = 503


# messages (sans-I/O) ------------------------------------------------------------


def encode_message(msg_type: str, node: Mapping[str, Any], **fields: Any) -> bytes:
    """One control message (see the module doc)."""
    return json.dumps({"v": VERSION, "type": msg_type, "node": dict(node), **fields},
                      separators=(",", ":"), ensure_ascii=False).encode()


def decode_message(data: bytes) -> dict[str, Any] | None:
    """A control message, checked; None for anything else (another version,
    not JSON, a field of the wrong type)."""
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or msg.get("v") != VERSION or msg.get("type") not in _TYPES:
        return None
    node = msg.get("node")
    if not isinstance(node, dict) or not isinstance(node.get("id"), str) or not node["id"]:
        return None
    if not isinstance(node.get("name", ""), str) or not isinstance(node.get("version", ""), str):
        return None
    kind = msg["type"]
    if kind in ("request", "reply") and not isinstance(msg.get("id"), str):
        return None
    if kind == "request" and (not isinstance(msg.get("op"), str) or not isinstance(msg.get("params", {}), dict)):
        return None
    if kind == "reply":
        if "error" in msg:
            if not isinstance(msg["error"], str):
                return None
        elif not isinstance(msg.get("result"), dict):
            return None
    return msg


class NodeRegistry:
    """The servers this one knows of, each until ``ttl`` s after it was last
    heard from (sans-I/O: the caller passes the time)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._nodes: dict[str, tuple[dict[str, Any], float]] = {}

    def seen(self, node: Mapping[str, Any], now: float) -> bool:
        """`node` was heard from at `now`; True if it was not known."""
        new = node["id"] not in self._nodes
        self._nodes[node["id"]] = ({k: node[k] for k in ("id", "name", "version") if k in node}, now + self.ttl)
        return new

    def leave(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def live(self, now: float) -> dict[str, dict[str, Any]]:
        """The servers heard from within ``ttl`` s, by id (the others are forgotten)."""
        for node_id in [n for n, (_, exp) in self._nodes.items() if exp <= now]:
            del self._nodes[node_id]
        return {n: info for n, (info, _) in self._nodes.items()}

    def __len__(self) -> int:
        return len(self._nodes)


def glob_filter(pattern: str) -> Callable[[str], bool]:
    """A predicate matching names against a Redis glob pattern (``*``, ``?``,
    ``[a-z]``, ``[^…]``, ``\\x``), on UTF-8 bytes as Redis does, in time
    proportional to len(pattern) × len(name) whatever the pattern (no
    backtracking blow-up)."""
    p = pattern.encode()
    star = None
    tokens: list[bytes | None] = []  # None: '*'; else a 256-entry table of the bytes matched
    i = 0
    while i < len(p):
        c = p[i]
        if c == 0x2A:  # '*'
            if not tokens or tokens[-1] is not star:
                tokens.append(star)
            i += 1
        elif c == 0x3F:  # '?'
            tokens.append(b"\x01" * 256)
            i += 1
        elif c == 0x5B:  # '['
            i += 1
            negate = i < len(p) and p[i] == 0x5E
            if negate:
                i += 1
            table = bytearray(256)
            while i < len(p) and p[i] != 0x5D:
                if p[i] == 0x5C and i + 1 < len(p):
                    i += 1
                    table[p[i]] = 1
                elif i + 2 < len(p) and p[i + 1] == 0x2D:
                    lo, hi = sorted((p[i], p[i + 2]))
                    for b in range(lo, hi + 1):
                        table[b] = 1
                    i += 2
                else:
                    table[p[i]] = 1
                i += 1
            i += 1  # the ']' (an unterminated class runs to the end)
            if negate:
                table = bytearray(1 - b for b in table)
            tokens.append(bytes(table))
        else:
            if c == 0x5C and i + 1 < len(p):  # '\x'
                i += 1
                c = p[i]
            table = bytearray(256)
            table[c] = 1
            tokens.append(bytes(table))
            i += 1

    def match(name: str) -> bool:
        s = name.encode()
        if not s:  # as Redis: an empty name matches only an empty pattern (not even "*")
            return not tokens
        pi = si = 0
        back_p, back_s = -1, 0
        n = len(tokens)
        while si < len(s):
            if pi < n and tokens[pi] is None:
                back_p, back_s = pi, si
                pi += 1
            elif pi < n and tokens[pi][s[si]]:  # type: ignore[index]
                pi += 1
                si += 1
            elif back_p >= 0:  # let the last '*' take one more byte
                back_s += 1
                pi, si = back_p + 1, back_s
            else:
                return False
        while pi < n and tokens[pi] is None:
            pi += 1
        return pi == n

    return match


# what one server does --------------------------------------------------------------


def _connected(server: Any) -> list[Any]:
    from juggler.context import ConnState

    return [c for c in list(server.conns) if c.state is ConnState.CONNECTED]


def _matching(server: Any, client: str | None, user: str | None) -> list[Any]:
    return [c for c in _connected(server)
            if (client is None or c.id == client) and (user is None or user_of(c) == user)]


def _opt_str(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


class NodeOps:
    """The operations every server runs on its own connections, by name
    (:attr:`table`), for :meth:`Control.request`. Their parameters come
    checked by the API, and are checked again here (they travel through Redis)."""

    def __init__(self, server: Any, *, name: str | None = None, version: str = "") -> None:
        self.server = server
        self.name = name
        self.version = version
        self.started = time.monotonic()
        self.table: dict[str, Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]] = {
            "info": self.info,
            "channels": self.channels,
            "disconnect": self.disconnect,
            "unsubscribe": self.unsubscribe,
            "subscribe": self.subscribe,
        }

    def node_name(self) -> str:
        """``host:port`` of this server's websocket listener, unless named
        (known from the time it listens)."""
        if self.name:
            return self.name
        try:
            port = self.server.port
        except (AssertionError, IndexError):  # not listening (yet, or any more)
            return f"{socket.gethostname()}:0"
        self.name = f"{socket.gethostname()}:{port}"
        return self.name

    async def info(self, params: Mapping[str, Any]) -> dict[str, Any]:
        conns = _connected(self.server)
        subs = self.server.subscriptions.channels()
        return {
            "uptime": round(time.monotonic() - self.started, 3),
            "connections": len(conns),
            "users": len({u for u in map(user_of, conns) if u is not None}),
            "subscriptions": sum(subs.values()),
            "channels": len(subs),
        }

    async def channels(self, params: Mapping[str, Any]) -> dict[str, Any]:
        filt = _opt_str(params, "pattern")
        match = glob_filter(filt) if filt is not None else None
        channels: dict[str, int] = {}
        patterns: dict[str, int] = {}
        for (pattern, name), count in self.server.subscriptions.channels().items():
            if count > 0 and (match is None or match(name)):
                (patterns if pattern else channels)[name] = count
        return {"channels": channels, "patterns": patterns}

    async def disconnect(self, params: Mapping[str, Any]) -> dict[str, Any]:
        client, user = _opt_str(params, "client"), _opt_str(params, "user")
        code, reason = params.get("code"), params.get("reason", "")
        if client is None and user is None:
            raise ValueError("client or user is required")
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(reason, str):
            raise ValueError("code must be an integer and reason a string")
        conns = _matching(self.server, client, user)
        for conn in conns:
            conn.close(code, reason)
        if conns:
            log.info("closed %d connection(s) (client=%s user=%s code=%d)", len(conns), client or "-",
                     user or "-", code)
        return {"disconnected": len(conns)}

    async def unsubscribe(self, params: Mapping[str, Any]) -> dict[str, Any]:
        channel = _opt_str(params, "channel")
        pattern = params.get("pattern", False)
        client, user = _opt_str(params, "client"), _opt_str(params, "user")
        if channel is None or not isinstance(pattern, bool):
            raise ValueError("channel must be a string and pattern true or false")
        done = 0
        for conn in self.server.subscriptions.subscribers(channel, pattern):
            if (client is None or conn.id == client) and (user is None or user_of(conn) == user):
                done += await conn.drop_subscription(channel, pattern)
        if done:
            log.info("unsubscribed %d connection(s) from %s%s (client=%s user=%s)", done, channel,
                     " (pattern)" if pattern else "", client or "-", user or "-")
        return {"unsubscribed": done}

    async def subscribe(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side subscriptions (:mod:`juggler.serversubs`)."""
        from juggler.serversubs import node_subscribe

        return await node_subscribe(self.server, params)


# the control plane -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeReply:
    """What one server answered to a request: ``result``, or ``error``."""

    node: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Survey:
    """The outcome of :meth:`Control.request`: the answers of the servers,
    this one first, and the servers that did not answer in time."""

    replies: list[NodeReply]
    missing: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class _Waiting:
    expected: set[str]
    replies: dict[str, NodeReply]
    done: asyncio.Future[None]


class Control:
    """This server's side of the control plane (see the module doc).

    ``router`` is the Redis broker's router (``juggler.broker.cluster``);
    None runs every request on this server alone. Lifecycle: ``start()``
    subscribes and says hello (raises :class:`ControlError` or a
    ``BrokerError`` when it cannot), ``aclose()`` says goodbye and closes;
    idempotent.
    """

    def __init__(self, ops: NodeOps, *, router: Any = None, heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 connect_timeout: float = 5.0, command_timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ops = ops
        self.id = rustext.new_uuid()
        self.heartbeat_interval = heartbeat_interval
        self.registry = NodeRegistry(3 * heartbeat_interval)
        self._clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._heartbeats: asyncio.Task[None] | None = None
        self._started = False
        self._subscribed = False
        self._closed = False
        #: the shard channels (``juggler.broker.redis.sharded.ShardedPubSub``); None: this server alone
        self.bus: Any = None
        if router is not None:
            from juggler.broker.redis.sharded import ShardedPubSub

            self.bus = ShardedPubSub(router, self._on_message, connect_timeout=connect_timeout,
                                     command_timeout=command_timeout, health_interval=heartbeat_interval)

    @classmethod
    def for_server(cls, server: Any, *, version: str = "", name: str | None = None, **kw: Any) -> Control:
        """The control plane of `server`: over its pub-sub Redis (or its one
        Redis), local with the in-memory broker."""
        router = getattr(server.pubsub, "router", None)
        config = getattr(server.pubsub, "config", None)
        if router is not None and config is not None:
            kw.setdefault("connect_timeout", config.connect_timeout)
            kw.setdefault("command_timeout", config.command_timeout)
        return cls(NodeOps(server, name=name, version=version), router=router, **kw)

    @property
    def node(self) -> dict[str, Any]:
        """This server as the others see it."""
        return {"id": self.id, "name": self.ops.node_name(), "version": self.ops.version}

    @property
    def distributed(self) -> bool:
        """True when requests reach other servers (a Redis broker)."""
        return self.bus is not None

    def nodes(self) -> list[dict[str, Any]]:
        """The servers known now, this one first."""
        others = self.registry.live(self._clock())
        return [self.node, *(info for node_id, info in others.items() if node_id != self.id)]

    # lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.bus is None:
            return
        for channel in (BROADCAST, inbox(self.id)):
            try:
                await self.bus.subscribe(channel)
            except BrokerError as exc:
                if "unknown command" in str(exc).lower():
                    raise ControlError("the server API across servers needs Redis 7 or later (sharded "
                                       f"pub-sub): {exc}") from exc
                raise ControlError(f"cannot subscribe to the control channels: {exc}") from exc
        self._subscribed = True
        await self._publish(BROADCAST, encode_message("heartbeat", self.node, hello=True))
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat(), name="juggler-heartbeat")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.wait([self._heartbeats])
        for waiting in self._waiting.values():
            if not waiting.done.done():
                waiting.done.set_result(None)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        if self.bus is not None:
            if self._subscribed:
                try:
                    async with asyncio.timeout(1.0):
                        await self._publish(BROADCAST, encode_message("leave", self.node))
                except (BrokerError, TimeoutError):
                    pass  # the others forget this server after three heartbeats
            await self.bus.aclose()

    async def __aenter__(self) -> Control:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            self.registry.live(self._clock())  # forget the silent ones
            try:
                await self._publish(BROADCAST, encode_message("heartbeat", self.node))
            except BrokerError as exc:
                log.warning("heartbeat not sent: %s", exc)

    async def _publish(self, channel: str, data: bytes) -> None:
        assert self.bus is not None
        await self.bus.publish(channel, data)

    # requests ------------------------------------------------------------------------

    async def request(self, op: str, params: Mapping[str, Any], timeout: float) -> Survey:
        """Run `op` on every server (this one included) and gather their
        answers, waiting up to `timeout` s for the servers known now. Raises
        :class:`ControlError` when the request cannot be sent. Cancelling it
        only stops the wait: the other servers still run it."""
        if self.bus is None:
            return Survey([await self._run_local(op, params)])
        expected = set(self.registry.live(self._clock())) - {self.id}
        request_id = rustext.new_uuid()
        waiting = _Waiting(expected, {}, asyncio.get_running_loop().create_future())
        self._waiting[request_id] = waiting
        try:
            # sent before it runs here: when the others cannot be reached, it runs nowhere
            try:
                await self._publish(BROADCAST, encode_message("request", self.node, id=request_id, op=op,
                                                              params=dict(params)))
            except BrokerError as exc:
                raise ControlError(f"cannot reach the other servers: {exc}") from exc
            local = await self._run_local(op, params)
            if expected and not waiting.done.done():
                try:
                    async with asyncio.timeout(timeout):
                        await waiting.done
                except TimeoutError:
                    pass
        finally:
            del self._waiting[request_id]
        others = self.registry.live(self._clock())
        missing = [others.get(n, {"id": n}) for n in sorted(expected - set(waiting.replies))]
        if missing:
            log.warning("%s: no answer from %s within %gs", op, ", ".join(m.get("name", m["id"]) for m in missing),
                        timeout)
        return Survey([local, *waiting.replies.values()], missing)

    async def _run_local(self, op: str, params: Mapping[str, Any]) -> NodeReply:
        fn = self.ops.table.get(op)
        if fn is None:
            return NodeReply(self.node, error=f"unknown operation {op!r}")
        try:
            return NodeReply(self.node, result=await fn(params))
        except ValueError as exc:
            return NodeReply(self.node, error=str(exc))
        except Exception as exc:
            log.exception("control operation %s failed", op)
            return NodeReply(self.node, error=f"internal error: {type(exc).__name__}")

    def _on_message(self, channel: str, data: bytes) -> None:
        msg = decode_message(data)
        if msg is None:
            log.debug("dropping an invalid control message: %.200r", data)
            return
        node = msg["node"]
        if node["id"] == self.id or self._closed:
            return
        kind = msg["type"]
        if kind == "leave":
            self.registry.leave(node["id"])
            log.info("server %s left", node.get("name") or node["id"])
            return
        if self.registry.seen(node, self._clock()):
            log.info("server %s joined", node.get("name") or node["id"])
        if kind == "heartbeat":
            if msg.get("hello") is True:  # a server starting: tell it at once that this one is here
                self._spawn(self._publish(inbox(node["id"]), encode_message("heartbeat", self.node)))
        elif kind == "request":
            self._spawn(self._answer(node["id"], msg["id"], msg["op"], msg.get("params", {})))
        elif kind == "reply":
            waiting = self._waiting.get(msg["id"])
            if waiting is None or waiting.done.done():
                return  # a late answer
            reply = (NodeReply(node, error=msg["error"]) if "error" in msg
                     else NodeReply(node, result=msg["result"]))
            waiting.replies[node["id"]] = reply
            if waiting.expected <= set(waiting.replies):
                waiting.done.set_result(None)

    async def _answer(self, to: str, request_id: str, op: str, params: Mapping[str, Any]) -> None:
        reply = await self._run_local(op, params)
        fields: dict[str, Any] = {"id": request_id}
        if reply.error is not None:
            fields["error"] = reply.error
        else:
            fields["result"] = reply.result
        await self._publish(inbox(to), encode_message("reply", self.node, **fields))

    def _spawn(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("control: %s", task.exception())
