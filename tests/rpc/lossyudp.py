"""A lossy UDP relay for the KCP tests: datagrams between clients and one
target, each dropped, duplicated or delayed (reordered) at random with a
seeded generator. One upstream socket per client address, so the target
(a kcp-go listener keys sessions by address) sees each client apart."""

from __future__ import annotations

import asyncio
import random
from typing import Any


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, relay: LossyUdpRelay, client: Any) -> None:
        self.relay, self.client = relay, client
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        front = self.relay.front
        if front is not None:
            self.relay.forward(lambda d: front.sendto(d, self.client), data)


class LossyUdpRelay(asyncio.DatagramProtocol):
    """``await start()``; then send to ``address``. ``loss``, ``dup``: chances
    per datagram; ``jitter``: the longest extra delay in seconds."""

    def __init__(self, target: tuple[str, int], *, loss: float, dup: float = 0.0, jitter: float = 0.0,
                 seed: int = 1) -> None:
        self.target = target
        self.loss, self.dup, self.jitter = loss, dup, jitter
        self.rng = random.Random(seed)
        self.front: asyncio.DatagramTransport | None = None
        self.upstreams: dict[Any, _Upstream] = {}
        self.dropped = self.passed = 0
        self._pending: dict[Any, list[bytes]] = {}

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=("127.0.0.1", 0))
        assert self.front is not None
        return self.front.get_extra_info("sockname")[:2]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.front = transport  # type: ignore[assignment]

    def forward(self, send: Any, data: bytes) -> None:
        if self.rng.random() < self.loss:
            self.dropped += 1
            return
        self.passed += 1
        loop = asyncio.get_running_loop()
        for _ in range(2 if self.rng.random() < self.dup else 1):
            delay = self.rng.random() * self.jitter
            if delay:
                loop.call_later(delay, send, data)
            else:
                send(data)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        up = self.upstreams.get(addr)
        if up is None:
            up = self.upstreams[addr] = _Upstream(self, addr)
            self._pending[addr] = [data]
            asyncio.ensure_future(self._open(up))
            return
        if up.transport is None:
            self._pending[addr].append(data)
            return
        self._send_up(up, data)

    async def _open(self, up: _Upstream) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: up, remote_addr=self.target)
        for data in self._pending.pop(up.client, []):
            self._send_up(up, data)

    def _send_up(self, up: _Upstream, data: bytes) -> None:
        transport = up.transport
        if transport is not None:
            self.forward(lambda d: transport.sendto(d) if not transport.is_closing() else None, data)

    def close(self) -> None:
        for up in self.upstreams.values():
            if up.transport is not None:
                up.transport.close()
        if self.front is not None:
            self.front.close()
