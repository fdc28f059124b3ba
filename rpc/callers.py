"""``ServerCaller`` by address: which caller serves an address.

- ``http://host:port``   rpcx's HTTP gateway (``rpc.gateway_client.HTTPCaller``),
                         ours or a Go rpcx server's (``https://`` over TLS)
- ``grpc://host:port``   grpc.aio (``rpc.grpc_peer``): the benchmark's reference peer
- ``inproc:NAME``        an in-process dispatcher serving the examples
                         (``Hello``, ``Arith``): client and service layer alone
- ``tcp@host:port`` / ``host:port`` / ``unix@/path``   the rpcx binary protocol
                         over ``rpc.transport`` (``rpc.rpcx_client.RpcxCaller``)

``open_caller(address, pool=, tls=)`` returns ``(caller, aclose)``; ``tls``
(a ``rustext.tls.ClientTls``) makes rpcx connections TLS and verifies
``https://`` gateways; ``kcp`` (an ``rpc.transport.kcpchannel.KcpOptions``)
is the block crypt of ``kcp@host:port`` addresses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rpc.message import Message

Caller = Callable[[str, Message, "float | None"], Awaitable["Message | None"]]
Closer = Callable[[], Awaitable[None]]
Factory = Callable[[str, int, Any], Awaitable[tuple[Caller, Closer]]]


async def _http(address: str, pool: int, tls: Any = None) -> tuple[Caller, Closer]:
    from rpc.gateway_client import HTTPCaller

    caller = HTTPCaller(pool=pool, tls=tls)
    return caller, caller.aclose


async def _inproc(address: str, pool: int, tls: Any = None) -> tuple[Caller, Closer]:
    from rpc.examples import register_example
    from rpc.inprocess import InProcessNetwork
    from rpc.service import ServiceDispatcher

    dispatcher = ServiceDispatcher()
    for name in ("bench", "arith"):
        register_example(dispatcher.registry, name)
    net = InProcessNetwork()
    net.add(address, dispatcher)

    async def close() -> None:
        await net.aclose()
        await dispatcher.aclose()

    return net, close


async def _grpc(address: str, pool: int, tls: Any = None) -> tuple[Caller, Closer]:
    from rpc.grpc_peer import GrpcCaller

    caller = GrpcCaller(pool=pool)
    return caller, caller.aclose


async def _rpcx(address: str, pool: int, tls: Any = None, kcp: Any = None) -> tuple[Caller, Closer]:
    from rpc.rpcx_client import RpcxCaller

    caller = RpcxCaller(pool=pool, tls=tls, kcp=kcp)
    return caller, caller.aclose


SCHEMES: dict[str, Factory] = {"http": _http, "inproc": _inproc, "grpc": _grpc, "rpcx": _rpcx}


def scheme_of(address: str) -> str:
    if address.startswith(("http://", "https://")):
        return "http"
    if address.startswith("inproc:"):
        return "inproc"
    if address.startswith("grpc://"):
        return "grpc"
    return "rpcx"


async def open_caller(address: str, *, pool: int = 1, tls: Any = None, kcp: Any = None) -> tuple[Caller, Closer]:
    scheme = scheme_of(address)
    factory = SCHEMES.get(scheme)
    if factory is None:
        raise LookupError(
            f"no caller for {address!r} (available: {', '.join(SCHEMES)})"
        )
    if tls is not None and scheme in ("inproc", "grpc"):
        raise ValueError(f"TLS options do not apply to {scheme} addresses")
    if scheme == "rpcx":
        return await _rpcx(address, pool, tls, kcp)
    return await factory(address, pool, tls)
