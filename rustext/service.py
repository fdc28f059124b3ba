"""The one lifecycle of every long-running part of the suite.

A juggler server, callee or whole juggler process (``juggler.runner``), an
rpc listener or server process (``rpc.runner``), a balancer
(``balancer.LoadBalancer``, ``balancer.runner``), a seq member or snowflake
worker: each is a :class:`Service`, started and stopped the same way, so
that one can be embedded, composed or driven by the command line alike:

- ``await service.start()``: bind and serve; a busy address raises
  :class:`rustext.net.ListenError`.
- ``await service.drain(timeout=None)``: stop taking new work (listeners
  closed, new requests refused as the protocol says), let the work in
  flight finish for up to ``timeout`` seconds (None: the service's own
  drain time, from its configuration), then close. Idempotent: a second
  call waits for the same drain.
- ``await service.aclose()``: :meth:`drain` with the service's own drain time.
- ``service.abort()``: stop now. A drain under way ends at once and the work
  in flight is dropped. Synchronous, and safe to call at any time (before
  :meth:`start`, twice, from a signal handler's callback): it is what a
  second Ctrl-C does.
- ``async with service:``: :meth:`start`, then :meth:`aclose`.

:class:`ServiceBase` gives a service the last two from its ``start`` and
``drain``; :func:`check_service` is what the tests use to hold every
service to it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

__all__ = ["Service", "ServiceBase", "check_service"]


@runtime_checkable
class Service(Protocol):
    """See the module doc."""

    async def start(self) -> None: ...

    async def drain(self, timeout: float | None = None) -> None: ...

    async def aclose(self) -> None: ...

    def abort(self) -> None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...


class ServiceBase:
    """What every :class:`Service` does alike, from its own ``start`` and
    ``drain``: :meth:`aclose` drains with the service's own drain time, and
    ``async with`` starts it and closes it. A service already started by
    the function that built it has a ``start`` that does nothing."""

    __slots__ = ()

    if TYPE_CHECKING:
        async def start(self) -> None: ...

        async def drain(self, timeout: float | None = None) -> None: ...

    async def aclose(self) -> None:
        """:meth:`drain` with the service's own drain time."""
        await self.drain()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def check_service(cls: type) -> list[str]:
    """What `cls` lacks of :class:`Service` (empty: it is one): each method
    present, async or not as it must be, ``drain`` taking ``timeout=None``."""
    problems = []
    for name in ("start", "drain", "aclose", "__aenter__", "__aexit__"):
        fn = getattr(cls, name, None)
        if fn is None:
            problems.append(f"no {name}()")
        elif not inspect.iscoroutinefunction(fn):
            problems.append(f"{name}() is not async")
    abort = getattr(cls, "abort", None)
    if abort is None:
        problems.append("no abort()")
    elif inspect.iscoroutinefunction(abort):
        problems.append("abort() is async (it must be a plain method)")
    drain = getattr(cls, "drain", None)
    if drain is not None:
        param = inspect.signature(drain).parameters.get("timeout")
        if param is None or param.default is not None:
            problems.append("drain() must take timeout=None")
    return problems
