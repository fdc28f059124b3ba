"""An in-process ``ServerCaller``: XClient over local ``ServiceDispatcher``s.

``InProcessNetwork`` maps addresses to dispatchers and delivers request
messages to them directly (no bytes, no sockets), with the server's
semantics: each address has one session (plugins' connection hooks run), a
failed auth "closes the connection" (the next call opens a new session),
oneway requests get no response, and a stopped address refuses like a dead
server (``TransportError`` CONNECT). It is what embedded use takes, and the
seam the tests drive the client governance through; the network transport
(``rpc.transport``) provides the same ``ServerCaller`` shape over TCP/unix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from rpc.errors import CallTimeout, TransportError, TransportErrorKind
from rpc.message import Message
from rpc.service import Peer, ServerSession, ServiceDispatcher


class InProcessNetwork:
    def __init__(self) -> None:
        self._servers: dict[str, ServiceDispatcher] = {}
        self._sessions: dict[str, ServerSession] = {}
        self._seq = itertools.count(1)
        self.calls: dict[str, int] = {}
        self._connecting = asyncio.Lock()

    def add(self, address: str, dispatcher: ServiceDispatcher) -> None:
        self._servers[address] = dispatcher

    async def remove(self, address: str) -> None:
        """Stop serving ``address`` (as if its process died): later calls fail
        with TransportError; the session's close hooks run."""
        self._servers.pop(address, None)
        session = self._sessions.pop(address, None)
        if session is not None:
            await session.close()

    async def _session(self, address: str, dispatcher: ServiceDispatcher) -> ServerSession:
        session = self._sessions.get(address)
        if session is not None:
            return session
        async with self._connecting:  # one connection per address, even under concurrent calls
            session = self._sessions.get(address)
            if session is None:
                session = dispatcher.session(Peer(address="inprocess", local_address=address))
                if not await session.accept():
                    await session.close()
                    raise TransportError(f"{address} refused the connection", TransportErrorKind.CONNECT)
                self._sessions[address] = session
            return session

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None:
        self.calls[address] = self.calls.get(address, 0) + 1  # attempts, dead servers included
        dispatcher = self._servers.get(address)
        if dispatcher is None:
            raise TransportError(f"connection refused: {address}", TransportErrorKind.CONNECT)
        session = await self._session(address, dispatcher)
        msg = dataclasses.replace(request, seq=next(self._seq), metadata=dict(request.metadata))
        try:
            async with asyncio.timeout(timeout):
                outcome = await session.handle(msg)
        except TimeoutError:
            raise CallTimeout(f"no response from {address} in {timeout:.3f}s") from None
        if outcome.close:
            self._sessions.pop(address, None)
            await session.close()
            if outcome.reply is None:
                raise TransportError(f"{address} closed the connection", TransportErrorKind.CLOSED)
        reply = outcome.reply
        if reply is not None:
            await session.written(msg, reply)
        if request.oneway:
            return None
        return reply

    async def aclose(self) -> None:
        for address in list(self._sessions):
            await self._sessions.pop(address).close()
