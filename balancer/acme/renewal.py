"""When to order and the task that does it.

:func:`due_at` is the rule (pure): a missing, placeholder or
wrong-names certificate is due now; a valid one when ``renew_before`` of
its lifetime is left (a third by default, as Caddy does). :class:`Renewer`
runs it for one balancer process: at each due time it takes the folder's
ordering lock, orders, stores the pair and has the data plane load it (new
handshakes get it, established connections keep theirs). A failed order
keeps the served certificate and is retried after a backoff growing with
jitter up to a day. A process that finds the lock taken, and any process
between orders, watches the stored certificate's modification time and
loads what another process stored instead of ordering itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from balancer.acme.challenges import DataPlane
from balancer.acme.client import AcmeClient, AcmeError
from balancer.acme.settings import Acme
from balancer.acme.storage import CertInfo, Storage
from rustext.backoff import BackoffPolicy

log = logging.getLogger("balancer.acme")

#: the longest wait between two failed orders
MAX_BACKOFF = 86_400.0


def due_at(info: CertInfo | None, names: tuple[str, ...], renewal: tuple[str, float]) -> float:
    """The Unix time the certificate should be renewed at (now or earlier: at once)."""
    if info is None or info.placeholder or not set(names) <= info.names:
        return 0.0
    kind, value = renewal
    if kind == "fraction":
        return info.not_after - (info.not_after - info.not_before) * value
    return info.not_after - value


class Renewer:
    """Keeps the certificate of ``settings.names`` obtained and fresh;
    ``start()`` then ``aclose()``. ``reload`` loads the stored pair into the
    data plane (raising on error, the old pair staying in service)."""

    def __init__(self, settings: Acme, plane: DataPlane, reload: Callable[[], None], *,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.storage = Storage(settings.storage)
        self.plane = plane
        self._reload = reload
        self._clock = clock
        self._backoff = BackoffPolicy(initial=settings.retry_seconds, maximum=max(MAX_BACKOFF, settings.retry_seconds),
                                      factor=2.0, jitter=0.5)
        self._rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._loaded_mtime = self.storage.cert_mtime()
        #: orders this process completed, and failed attempts since the last success
        self.orders = 0
        self.failures = 0
        self.last_error: str | None = None
        #: the Unix time of the next attempt (for the admin and tests)
        self.next_attempt = 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="balancer acme")

    def stop(self) -> None:
        """Cancel at once (an order under way is abandoned; the folder's lock is released)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.storage.unlock()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self.storage.unlock()

    def _pick_up(self) -> None:
        """Load the stored pair if it changed since this process last loaded it."""
        mtime = self.storage.cert_mtime()
        if mtime == self._loaded_mtime:
            return
        try:
            self._reload()
        except Exception as exc:  # noqa: BLE001  # a pair being written right now: the next look retries
            log.warning("ACME: the stored certificate is not loaded yet: %s", exc)
            return
        self._loaded_mtime = mtime
        log.info("ACME: loaded the certificate stored in %s", self.storage.path)

    async def _run(self) -> None:
        watch = self.settings.watch_seconds
        while True:
            self._pick_up()
            due = due_at(self.storage.certificate(), self.settings.names, self.settings.renewal())
            if self.failures:
                due = max(due, self.next_attempt)
            self.next_attempt = due
            now = self._clock()
            if due > now:
                await asyncio.sleep(min(due - now, watch))  # a timer: the next look or the due time
                continue
            if not self.storage.try_lock():
                await asyncio.sleep(watch)  # another process orders: its certificate shows up in the folder
                continue
            try:
                # another process may have stored a fresh one between our look and the lock
                if due_at(self.storage.certificate(), self.settings.names, self.settings.renewal()) > self._clock():
                    continue
                await self._order()
            except (TimeoutError, AcmeError, OSError, ValueError, KeyError) as exc:
                self._failed(exc)
            except Exception as exc:  # noqa: BLE001  # aiohttp's errors and the like: the same backoff
                self._failed(exc)
            finally:
                self.storage.unlock()

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = str(exc) or type(exc).__name__
        wait = self._backoff.delay(self.failures, self._rng)
        self.next_attempt = self._clock() + wait
        log.error("ACME: no certificate for %s: %s; the current one stays, retrying in %.1f s",
                  ", ".join(self.settings.names), self.last_error, wait)

    async def _order(self) -> None:
        s = self.settings
        log.info("ACME: ordering a certificate for %s from %s", ", ".join(s.names), s.directory)
        key = self.storage.account_key()
        async with AcmeClient(s.directory, key, ca_root=s.ca_root) as client:
            known = self.storage.account(s.directory)
            kid = await client.account(s.email, known)
            self.storage.save_account(s.directory, kid)
            try:
                chain, cert_key = await client.order(s.names, self.plane, s.challenges)
            except AcmeError as exc:
                if known is None or "accountDoesNotExist" not in str(exc):
                    raise
                # the CA forgot the stored account (a test CA restarted, an account deactivated): a new one
                kid = await client.account(s.email, None)
                self.storage.save_account(s.directory, kid)
                chain, cert_key = await client.order(s.names, self.plane, s.challenges)
        self.storage.save_certificate(chain, cert_key)
        self._reload()
        self._loaded_mtime = self.storage.cert_mtime()
        self.orders += 1
        self.failures = 0
        self.last_error = None
        info = self.storage.certificate()
        if info is not None:
            log.info("ACME: new certificate for %s, valid until %s", ", ".join(s.names),
                     time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.not_after)))
