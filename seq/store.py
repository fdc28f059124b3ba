"""The durable store of one member: name → high-water mark, on disk.

Layout of a data directory::

    meta.json        {"version": 2, "state": ..., "cluster": ..., "epoch": ..., "members": [...],
                     "pending": {...} (a membership change in progress)}, replaced atomically
    log.<gen>        append-only log (format in :mod:`seq.log`); one current generation
    LOCK             flock'd by the server process using the directory (seq.startup)

Durability rules:

- A write is acknowledged (its future completes) only after the bytes are
  written and ``fdatasync`` returned. Writes made while an fsync is running
  form the next batch, so concurrent writes share one fsync (group commit).
  File I/O runs on the store's own single worker thread, never on the loop.
- Compaction writes the whole state to ``log.<gen+1>.tmp``, fsyncs it,
  renames it to ``log.<gen+1>``, fsyncs the directory, then deletes the old
  generation: at every instant one complete log is in place.
- ``meta.json`` is replaced the same way (temp + fsync + rename + dir fsync).
- In memory, a value changes at once (so two compare-and-sets on the same
  name are decided in arrival order); on disk it follows with the batch.
  After a crash the store reloads the last durable value, which is at least
  every value it acknowledged: it never goes backwards past an ack.
- An I/O error poisons the store (a failed fsync cannot be retried safely):
  every pending and later write fails with :class:`StoreError`; the server
  exits and recovers from the log on restart.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from seq.errors import StoreCorrupt, StoreError
from seq.log import HEADER, MAX_VALUE, decode_log, encode_batch

log = logging.getLogger("seq.store")

State = Literal["bootstrapping", "catching_up", "ready", "joining", "removed"]
STATES = ("bootstrapping", "catching_up", "ready", "joining", "removed")
META = "meta.json"
_LOG_RE = re.compile(r"^log\.(\d{8})$")
_TMP_RE = re.compile(r"^(log\.\d{8}|meta\.json)\.tmp$")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: str) -> None:
    """Create `path` if missing, with its entry made durable in the parent (power loss)."""
    if os.path.isdir(path):
        return
    os.makedirs(path, exist_ok=True)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _write_atomic(directory: str, name: str, data: bytes) -> None:
    """temp + fsync + rename + directory fsync."""
    tmp = os.path.join(directory, name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, name))
    _fsync_dir(directory)


@dataclass(frozen=True, slots=True)
class Pending:
    """A membership change this member was fenced for (see :mod:`seq.membership`)."""

    epoch: int  # the configuration epoch it moves to
    members: tuple[str, ...]  # the configuration it moves to
    token: str  # which change (two changes to the same epoch never share one)


@dataclass(frozen=True, slots=True)
class Meta:
    """What a member is, besides its values.

    ``epoch`` and ``members`` are the configuration (the member list and its
    version): the persisted one is what a restarted member uses, whatever
    ``--peers`` says. A version-1 file (written before membership changes)
    has neither: ``epoch`` 0 and ``members`` () mean "the member list whose
    fingerprint is ``cluster``, at epoch 1".
    """

    state: State
    cluster: str  # the cluster's id: fingerprint of the member list it was bootstrapped with ("": not known yet)
    epoch: int = 0  # configuration epoch (0: not known yet, or a version-1 file)
    members: tuple[str, ...] = ()  # the configuration's members, sorted
    pending: Pending | None = None  # a membership change this member is fenced for (it does not vote meanwhile)


def read_meta(directory: str) -> Meta | None:
    """The directory's meta, or None when it has none (a new or wiped directory)."""
    try:
        with open(os.path.join(directory, META), "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreCorrupt(f"unreadable {META}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("version") not in (1, 2) or raw.get("state") not in STATES:
        raise StoreCorrupt(f"unexpected {META}: {raw!r}")
    try:
        pending = raw.get("pending")
        return Meta(
            state=raw["state"],
            cluster=str(raw.get("cluster", "")),
            epoch=int(raw.get("epoch", 0)),
            members=tuple(str(m) for m in raw.get("members", ())),
            pending=None if pending is None else Pending(
                epoch=int(pending["epoch"]), members=tuple(str(m) for m in pending["members"]),
                token=str(pending["token"]),
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupt(f"unexpected {META}: {raw!r}") from exc


def write_meta(directory: str, meta: Meta) -> None:
    ensure_dir(directory)
    doc: dict[str, object] = {"version": 2, "state": meta.state, "cluster": meta.cluster, "epoch": meta.epoch,
                              "members": list(meta.members)}
    if meta.pending is not None:
        doc["pending"] = {"epoch": meta.pending.epoch, "members": list(meta.pending.members),
                          "token": meta.pending.token}
    _write_atomic(directory, META, json.dumps(doc).encode())


def log_generations(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _LOG_RE.match(n)))


class Store:
    """Durable name → value map with compare-and-set and group commit.

    Use :meth:`open` (blocking, at startup), then the methods from the event
    loop only. ``cas``/``advance``/``merge`` decide at once and return a
    future that completes when the change is on disk.
    """

    def __init__(
        self,
        directory: str,
        gen: int,
        fd: int,
        values: dict[str, int],
        log_bytes: int,
        *,
        compact_bytes: int,
    ) -> None:
        self.directory = directory
        self._gen = gen
        self._fd = fd
        self._values = values
        #: the names in order, built at the first listing and kept up to date after
        self._order: list[str] | None = None
        self._log_bytes = log_bytes
        self._compact_bytes = compact_bytes
        self._dirty: dict[str, int] = {}
        self._batch: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seq-store")
        self._failed: BaseException | None = None
        self._closed = False
        self._flusher: asyncio.Task[None] | None = None
        self.fsyncs = 0  # batches written (one fsync each): stats
        self.writes = 0  # entries written

    # -- lifecycle --------------------------------------------------------

    @classmethod
    def open(cls, directory: str, *, create: bool, compact_bytes: int = 4 << 20) -> Store:
        """Load the newest log generation (cutting a torn tail) or create an empty one.

        `create` allows starting an empty log when none exists; otherwise a
        missing log is :class:`StoreCorrupt` (the data was lost).
        """
        ensure_dir(directory)
        for name in os.listdir(directory):
            if _TMP_RE.match(name):  # an interrupted compaction or meta write
                os.unlink(os.path.join(directory, name))
        gens = log_generations(directory)
        if not gens:
            if not create:
                raise StoreCorrupt(f"no log in {directory}: the data was lost")
            _write_atomic(directory, f"log.{1:08d}", HEADER)
            gens = [1]
        gen = gens[-1]
        path = os.path.join(directory, f"log.{gen:08d}")
        with open(path, "rb") as f:
            data = f.read()
        decoded = decode_log(data)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            if decoded.torn:
                log.warning("%s: cutting a torn tail of %d bytes", path, len(data) - decoded.valid_end)
                os.ftruncate(fd, decoded.valid_end)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        for old in gens[:-1]:  # superseded generations (compaction finished renaming)
            os.unlink(os.path.join(directory, f"log.{old:08d}"))
        return cls(directory, gen, fd, decoded.values, decoded.valid_end, compact_bytes=compact_bytes)

    def start(self) -> None:
        """Start the flusher task (call from the running loop)."""
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="seq-store-flush")

    async def aclose(self) -> None:
        """Write what is pending, then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            self._wake.set()
            if self._dirty and self._failed is None and self._batch is not None:
                try:
                    await asyncio.shield(self._batch)
                except StoreError:
                    pass
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)
        try:
            os.close(self._fd)
        except OSError:
            pass

    # -- reads --------------------------------------------------------------

    def get(self, name: str) -> int:
        """The high-water mark of `name`: the next ID it would hand out (1 when new)."""
        return self._values.get(name, 1)

    def snapshot(self) -> dict[str, int]:
        return dict(self._values)

    def names(self) -> Iterable[str]:
        """The names held, unordered: a live view (iterate it without awaiting in between)."""
        return self._values.keys()

    def names_page(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` names in order, those after ``after`` (all: None).
        The order is built once, at the first call (a sort of every name),
        then kept as names are added: a page costs a binary search."""
        if self._order is None:
            self._order = sorted(self._values)
        start = 0 if after is None else bisect.bisect_right(self._order, after)
        return self._order[start:start + limit]

    def __len__(self) -> int:
        return len(self._values)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # -- writes -------------------------------------------------------------

    def cas(self, name: str, expected: int, new: int) -> tuple[bool, int, asyncio.Future[None] | None]:
        """Move `name` to `new` only if its value is ≤ `expected` (and < `new`).

        Returns (accepted, value now, durability future or None).
        """
        self._check()
        cur = self._values.get(name, 1)
        if cur > expected or new <= cur or new > MAX_VALUE:
            return False, cur, None
        return True, new, self._set(name, new)

    def advance(self, name: str, new: int) -> tuple[bool, asyncio.Future[None] | None]:
        """Move `name` forward to `new` if its value is strictly lower."""
        self._check()
        if new > MAX_VALUE:
            return False, None
        if self._values.get(name, 1) >= new:
            return False, None
        return True, self._set(name, new)

    def merge(self, values: dict[str, int]) -> asyncio.Future[None]:
        """Raise every name to at least the given value (catch-up); a future for durability."""
        self._check()
        if self._order is not None and len(values) > 1000:
            self._order = None  # many new names at once: sort again at the next listing
        for name, value in values.items():
            if value > self._values.get(name, 1) and value <= MAX_VALUE:
                self._remember(name)
                self._values[name] = value
                self._dirty[name] = value
        return self._current_batch()

    def _check(self) -> None:
        if self._failed is not None:
            raise StoreError(f"store failed earlier: {self._failed}") from self._failed
        if self._closed:
            raise StoreError("store is closed")

    def _remember(self, name: str) -> None:
        if self._order is not None and name not in self._values:
            bisect.insort(self._order, name)

    def _set(self, name: str, value: int) -> asyncio.Future[None]:
        self._remember(name)
        self._values[name] = value
        self._dirty[name] = value
        return self._current_batch()

    def _current_batch(self) -> asyncio.Future[None]:
        if self._batch is None:
            self._batch = asyncio.get_running_loop().create_future()
        self._wake.set()
        return self._batch

    # -- the flusher ------------------------------------------------------

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._batch is not None:
                fut, dirty = self._batch, self._dirty
                self._batch, self._dirty = None, {}
                # Taken in the same loop turn as `dirty`: memory == disk after this batch.
                snapshot = dict(self._values) if self._log_bytes >= self._compact_bytes else None
                try:
                    await loop.run_in_executor(self._executor, self._write, dirty, snapshot)
                except OSError as exc:
                    self._poison(exc, fut)
                    return
                self.fsyncs += 1
                self.writes += len(dirty)
                if not fut.done():
                    fut.set_result(None)

    def _poison(self, exc: BaseException, fut: asyncio.Future[None]) -> None:
        log.critical("store %s failed: %s; refusing further writes", self.directory, exc)
        self._failed = exc
        err = StoreError(f"write or fsync failed: {exc}")
        for f in (fut, self._batch):
            if f is not None and not f.done():
                f.set_exception(err)
                f.exception()  # mark retrieved: awaiters still get it
        self._batch = None

    def _write(self, dirty: dict[str, int], snapshot: dict[str, int] | None) -> None:
        """Runs on the store thread."""
        if snapshot is not None:
            self._compact(snapshot)
            return
        if not dirty:
            return  # nothing changed (e.g. a catch-up that learned nothing): nothing to make durable
        data = encode_batch(dirty.items())
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fdatasync(self._fd)
        self._log_bytes += len(data)

    def _compact(self, snapshot: dict[str, int]) -> None:
        gen = self._gen + 1
        body = HEADER + encode_batch(snapshot.items()) if snapshot else HEADER
        _write_atomic(self.directory, f"log.{gen:08d}", body)
        old_fd, old_gen = self._fd, self._gen
        self._fd = os.open(os.path.join(self.directory, f"log.{gen:08d}"), os.O_WRONLY | os.O_APPEND)
        self._gen, self._log_bytes = gen, len(body)
        os.close(old_fd)
        os.unlink(os.path.join(self.directory, f"log.{old_gen:08d}"))
        # Grow the threshold with the state so a big state does not compact every batch.
        self._compact_bytes = max(self._compact_bytes, 4 * len(body))
        log.info("compacted %s into generation %d (%d names)", self.directory, gen, len(snapshot))
