"""The channel interface: a reliable byte stream that can ``connect`` and
``listen``, each time driving an ``asyncio.Protocol`` made by a factory.

Kept apart from the implementations (``channels``: TCP, Unix, in-process;
``quic``) so that each of them depends on the interface only.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable

from rpc.transport.endpoint import Endpoint

ProtocolFactory = Callable[[], asyncio.Protocol]


class Listener(ABC):
    """A listening channel; ``endpoint`` is the bound address (real port for tcp:0)."""

    endpoint: Endpoint

    @abstractmethod
    def close(self) -> None:
        """Stop accepting (idempotent); existing connections are not touched."""

    @abstractmethod
    async def wait_closed(self) -> None: ...


class Channel(ABC):
    @abstractmethod
    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]: ...

    @abstractmethod
    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener: ...
