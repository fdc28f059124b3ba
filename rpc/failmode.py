"""Fail modes: what a client does when a call to a server fails.

- ``FAILFAST``   one try; the error goes to the caller.
- ``FAILOVER``   retry on *another* server (one not tried yet, while there is one).
- ``FAILTRY``    retry the *same* server.
- ``FAILBACKUP`` send the call to a second server if the first has not answered
                 within ``backup_latency`` (or failed); the first success wins and
                 the other call is cancelled.

``retries`` is the number of retries after the first try (rpcx's
``Retries``), ``retry_interval`` the pause between tries. Only retryable
errors (``rpc.errors.is_retryable``: transport errors, open circuits) are
retried: a ``ServiceError`` is the server's answer and goes to the caller at
once, and the caller's deadline (``CallTimeout``) ends the call.

``execute`` is independent of the network: it takes ``pick(exclude)`` (choose
a server) and ``attempt(address)`` (call it), so it is tested with in-process
callables and used by ``XClient`` over the transport.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from rpc.errors import CallTimeout, CircuitOpen, NoServerAvailable, ServiceError, is_retryable

T = TypeVar("T")


class FailMode(enum.Enum):
    FAILFAST = "failfast"
    FAILOVER = "failover"
    FAILTRY = "failtry"
    FAILBACKUP = "failbackup"

    @classmethod
    def parse(cls, value: str | FailMode) -> FailMode:
        if isinstance(value, FailMode):
            return value
        try:
            return cls(value.lower())
        except ValueError:
            raise ValueError(f"unknown fail mode {value!r} ({', '.join(m.value for m in cls)})") from None


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    retries: int = 3
    retry_interval: float = 0.0
    backup_latency: float = 0.010

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if self.retry_interval < 0 or self.backup_latency < 0:
            raise ValueError("retry_interval and backup_latency must be >= 0")


Pick = Callable[[frozenset[str]], str]  # raises NoServerAvailable
Attempt = Callable[[str], Awaitable[T]]


async def execute(
    mode: FailMode,
    policy: RetryPolicy,
    pick: Pick,
    attempt: Callable[[str], Awaitable[T]],
    *,
    deadline: float | None = None,
) -> T:
    """Run a call under ``mode``. ``deadline`` (``loop.time()``) bounds the
    whole call, retries and pauses included (``CallTimeout`` when it passes)."""
    if deadline is None:
        return await _run(mode, policy, pick, attempt)
    try:
        async with asyncio.timeout_at(deadline):
            return await _run(mode, policy, pick, attempt)
    except TimeoutError as exc:
        if isinstance(exc, CallTimeout):
            raise
        raise CallTimeout("call deadline exceeded") from None


async def _run(mode: FailMode, policy: RetryPolicy, pick: Pick, attempt: Callable[[str], Awaitable[T]]) -> T:
    if mode is FailMode.FAILBACKUP:
        return await _backup(policy, pick, attempt)
    if mode is FailMode.FAILFAST:
        return await attempt(pick(frozenset()))
    tried: set[str] = set()
    addr = pick(frozenset())
    tries_left = policy.retries
    while True:
        tried.add(addr)
        try:
            return await attempt(addr)
        except Exception as exc:
            if not is_retryable(exc) or tries_left <= 0:
                raise
            last = exc
        tries_left -= 1
        if policy.retry_interval:
            await asyncio.sleep(policy.retry_interval)
        if mode is FailMode.FAILOVER:
            try:
                addr = pick(frozenset(tried))
            except (NoServerAvailable, CircuitOpen):
                # every other server tried or open: start over rather than give up early
                try:
                    addr = pick(frozenset())
                except (NoServerAvailable, CircuitOpen):
                    raise last from None
                tried.clear()


async def _backup(policy: RetryPolicy, pick: Pick, attempt: Callable[[str], Awaitable[T]]) -> T:
    first = pick(frozenset())
    primary = asyncio.ensure_future(attempt(first))
    backup: asyncio.Future[T] | None = None
    try:
        done, _ = await asyncio.wait({primary}, timeout=policy.backup_latency)
        if primary in done and _settled(primary):
            return primary.result()
        try:
            second = pick(frozenset({first}))
        except (NoServerAvailable, CircuitOpen):
            second = first
        backup = asyncio.ensure_future(attempt(second))
        pending: set[asyncio.Future[T]] = {primary, backup} - done
        errors: list[BaseException] = [primary.exception()] if primary in done else []  # type: ignore[list-item]
        while pending:
            done2, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done2:
                if _settled(fut):
                    return fut.result()
                errors.append(fut.exception())  # type: ignore[arg-type]
        raise errors[-1]
    finally:
        for fut in (primary, backup):
            if fut is not None and not fut.done():
                fut.cancel()


def _settled(fut: asyncio.Future[object]) -> bool:
    """A finished attempt that ends the call: a success, or a service error
    (the server's answer is never retried)."""
    if fut.cancelled():
        return False
    exc = fut.exception()
    return exc is None or isinstance(exc, ServiceError) or not is_retryable(exc)
