"""A TCP proxy that injects faults between a client and a real server.

Real sockets on 127.0.0.1, nothing mocked: each accepted connection is
forwarded to the upstream, and the test decides what goes wrong:

- :meth:`FaultProxy.cut_reply_to` -- the next time a client sends a
  command containing some bytes, forward it (the server runs it), then drop
  the connection instead of forwarding the server's reply: "the connection
  was lost after the command was sent", the case where the client cannot
  know whether it ran.
- :meth:`FaultProxy.hold_replies` / :meth:`FaultProxy.release_replies` --
  the server's replies are held back (the server is slow) while the client's
  commands keep going through; :meth:`FaultProxy.seen` counts them.
- :meth:`FaultProxy.reset_all` -- reset every connection now.
- :meth:`FaultProxy.refuse` -- accept and drop every new connection at once
  (a server at its connection limit, a proxy without its backend).
- :meth:`FaultProxy.latency` -- delay what goes each way (a slow link).
- :meth:`FaultProxy.resetting` -- reset every connection, and each new one
  as soon as it sends something (toxiproxy's ``reset_peer``).
- :meth:`FaultProxy.unreachable` -- reset every connection and stop
  listening: a new one is refused (a server down, a proxy disabled).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

__all__ = ["FaultProxy"]


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    held: list[bytes] = field(default_factory=list)


class FaultProxy:
    """``async with FaultProxy(upstream_port) as proxy``: clients connect to ``proxy.port``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.accepted = 0
        self._server: asyncio.AbstractServer | None = None
        self._links: set[_Link] = set()
        self._cut: list[bytes] = []  # patterns whose next command loses its reply
        self.cut_done = asyncio.Event()
        self._holding = False
        self._refusing = False
        self._seen: dict[bytes, int] = {}
        self._seen_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._delay = {"up": 0.0, "down": 0.0}  # seconds added client -> server ("up") and back
        self._last_at: dict[tuple[int, str], float] = {}  # (link, direction): when its last delayed write goes
        self._resetting = False

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.reset_all()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    # faults -----------------------------------------------------------------------------

    def cut_reply_to(self, pattern: bytes) -> None:
        """The next command containing `pattern` is forwarded, and the
        connection is dropped when the server's reply comes, the reply lost."""
        self._cut.append(pattern)
        self.cut_done.clear()

    def watch(self, *patterns: bytes) -> None:
        """Count the commands containing each pattern (see :meth:`seen`)."""
        for p in patterns:
            self._seen.setdefault(p, 0)

    def seen(self, pattern: bytes) -> int:
        return self._seen.get(pattern, 0)

    async def wait_seen(self, pattern: bytes, count: int, timeout: float = 10.0) -> None:
        """Until `count` commands containing `pattern` went through (bounded)."""
        async with asyncio.timeout(timeout):
            while self.seen(pattern) < count:
                self._seen_changed.clear()
                await self._seen_changed.wait()

    def hold_replies(self) -> None:
        self._holding = True

    def release_replies(self) -> None:
        self._holding = False
        for link in list(self._links):
            for data in link.held:
                link.client.write(data)
            link.held.clear()

    def refuse(self, on: bool = True) -> None:
        self._refusing = on

    def reset_all(self) -> None:
        for link in list(self._links):
            _reset(link.client)
            _reset(link.server)
        self._links.clear()

    # forwarding ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        cut = asyncio.Event()  # set: the reply to the command just forwarded must be lost
        for coro in (self._client_to_server(link, reader, cut), self._server_to_client(link, up_reader, cut)):
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _client_to_server(self, link: _Link, reader: asyncio.StreamReader, cut: asyncio.Event) -> None:
        try:
            while data := await reader.read(65536):
                for p in self._seen:
                    n = data.count(p)
                    if n:
                        self._seen[p] += n
                        self._seen_changed.set()
                for p in list(self._cut):
                    if p in data:
                        self._cut.remove(p)
                        cut.set()
                if self._resetting:
                    break
                self._forward(link, link.server, data, "up")
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._drop(link)

    async def _server_to_client(self, link: _Link, reader: asyncio.StreamReader, cut: asyncio.Event) -> None:
        try:
            while data := await reader.read(65536):
                if cut.is_set():
                    # the server answered the command: drop the connection, the answer lost
                    self.cut_done.set()
                    break
                if self._resetting:
                    break
                if self._holding:
                    link.held.append(data)
                else:
                    self._forward(link, link.client, data, "down")
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        self._last_at.pop((id(link), "up"), None)
        self._last_at.pop((id(link), "down"), None)
        if link in self._links:
            self._links.discard(link)
            _reset(link.client)
            _reset(link.server)

    # faults added after the forwarding above ----------------------------------------------

    def latency(self, up: float = 0.0, down: float = 0.0) -> None:
        """Delay what the client sends by `up` seconds and what the server
        answers by `down` (0 = none). The bytes keep their order; a
        connection is not slowed down beyond the delay (writes overlap)."""
        self._delay = {"up": up, "down": down}

    def resetting(self, on: bool = True) -> None:
        """While on, reset every connection now and every new one as soon as
        either side sends something: connections are accepted, then lost."""
        self._resetting = on
        if on:
            self.reset_all()

    async def unreachable(self, on: bool = True) -> None:
        """While on, nothing listens on :attr:`port` (connecting is refused) and
        every connection is reset; off, the same port listens again."""
        assert self._server is not None
        if on:
            self._server.close()
            self.reset_all()
            await self._server.wait_closed()
        else:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def held_bytes(self) -> int:
        """Bytes of replies held back now (see :meth:`hold_replies`)."""
        return sum(len(d) for link in self._links for d in link.held)

    def _forward(self, link: _Link, to: asyncio.StreamWriter, data: bytes, direction: str) -> None:
        delay = self._delay[direction]
        key = (id(link), direction)
        loop = asyncio.get_running_loop()
        if delay <= 0 and key not in self._last_at:
            to.write(data)
            return
        # after the writes already delayed on this link, whatever the delay is now
        at = max(loop.time() + delay, self._last_at.get(key, 0.0) + 1e-6)
        self._last_at[key] = at
        loop.call_at(at, self._write_delayed, link, to, data, key, at)

    def _write_delayed(self, link: _Link, to: asyncio.StreamWriter, data: bytes, key: tuple[int, str],
                       at: float) -> None:
        if self._last_at.get(key) == at:
            del self._last_at[key]  # nothing more delayed behind it
        if link in self._links and not to.is_closing():
            to.write(data)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(Exception):
        writer.transport.abort()
