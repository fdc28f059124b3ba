"""Helpers of the presence tests: a stand-in for the server's connections
(what the presence service calls on them) and brokers of each kind."""

from __future__ import annotations

import json
from typing import Any

import pytest

import rustext
from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig

BACKENDS = ["memory", "redis", "cluster"]


class FakeConn:
    """The part of juggler.conn.Conn the presence service uses: ``id``,
    ``identity``, ``closed`` and ``send``; the frames sent are kept."""

    def __init__(self, identity: Any = None) -> None:
        self.id = rustext.new_uuid()
        self.identity = identity
        self.closed = False
        self.frames: list[bytes] = []

    def send(self, msg_type: int, for_uuid: str, frame: bytes) -> None:
        assert msg_type == rustext.EVNT and for_uuid == ""
        self.frames.append(frame)

    @property
    def notices(self) -> list[dict[str, Any]]:
        """The payloads of the frames sent (each checked to be a notice EVNT)."""
        out = []
        for frame in self.frames:
            assert frame.endswith(b"\n")
            msg = json.loads(frame)
            assert msg["meta"]["type"] == 10
            assert rustext.canonical_uuid(msg["meta"]["uuid"]) == msg["meta"]["uuid"]
            assert "for" not in msg["payload"] and "args" not in msg["payload"]
            out.append(msg["payload"])
        return out


async def make_broker(backend: str, request: pytest.FixtureRequest) -> Any:
    if backend == "memory":
        broker: Any = MemoryBroker()
    elif backend == "redis":
        broker = RedisBroker(RedisBrokerConfig(url=request.getfixturevalue("redis_url")))
    else:
        broker = RedisBroker(RedisBrokerConfig(cluster=request.getfixturevalue("cluster_seeds")))
    await broker.start()
    return broker
