"""Binary upgrade: a running balancer hands its listening sockets over to a
new process (HAProxy's ``-x`` with ``expose-fd listeners``, nginx's USR2).

The running process serves :class:`HandoverServer` on a Unix socket
(``handover_socket``, mode 0600, peers of another uid refused by their
``SO_PEERCRED``). The new one (``--takeover PATH``) uses :class:`Takeover`:

1. ``listeners`` → one message per listener: ``{"listener": KEY, "tls": B}``
   with copies of its sockets attached (``SCM_RIGHTS``), then ``{"done": N}``;
2. the new process starts on those sockets (both accept for a moment: no
   connection is refused), then sends ``drain`` → ``{"ok": true}``; the old
   process closes its handover socket, stops accepting, finishes what is in
   flight and exits 0.

If the new process fails before ``drain`` it just closes the connection;
the old one keeps serving as if nothing happened. Messages are datagrams of
a ``SOCK_SEQPACKET`` socket: one message, one listener, no framing needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any

from balancer.errors import BalancerError

__all__ = ["HandoverError", "HandoverServer", "Takeover"]

log = logging.getLogger("balancer.handover")

#: the largest message of the exchange (a listener's key and flags)
MAX_MESSAGE = 4096
#: descriptors per message (the kernel's SCM_MAX_FD is 253)
FDS_PER_MESSAGE = 200
#: seconds a peer gets for each step of the exchange
STEP_TIMEOUT = 60.0


class HandoverError(BalancerError):
    """A takeover that cannot be done; the message says why (the running
    process, if any, keeps serving)."""


def _send(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class HandoverServer:
    """The running side: ``await start()``, ``await aclose()`` (idempotent).

    ``sockets()`` gives (key, tls, fds) with fds owned by the caller (closed
    here once sent); ``on_drain()`` is called once a new process took over.
    """

    def __init__(self, path: str, sockets: Callable[[], list[tuple[str, bool, list[int]]]],
                 on_drain: Callable[[], None]) -> None:
        self.path = path
        self._sockets = sockets
        self._on_drain = on_drain
        self._listener: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self._owner: socket.socket | None = None  # the session taking over, from its "listeners"
        self._done = False

    async def start(self) -> None:
        _clear_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)  # the uid check below is the guard; this keeps others from connecting at all
            sock.listen(8)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise HandoverError(f"cannot open the handover socket {self.path}: {exc.strerror or exc}") from exc
        self._listener = sock
        self._task = asyncio.create_task(self._accept(), name="balancer handover")

    async def aclose(self) -> None:
        self.close_listener()
        sessions = [t for t in self._sessions if t is not asyncio.current_task()]
        for t in sessions:
            t.cancel()
        await asyncio.gather(*sessions, return_exceptions=True)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # EMFILE and the like: keep the socket, try again shortly
                log.warning("handover socket: accept failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            task = asyncio.create_task(self._session(conn))
            self._sessions.add(task)
            task.add_done_callback(self._sessions.discard)

    async def _session(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            uid = _peer_uid(conn)
            if uid != os.getuid():
                log.warning("handover socket: refused a process of uid %d (only uid %d may take over)",
                            uid, os.getuid())
                # its request read first: closing on unread data would reset the
                # connection, and the peer would never see why
                async with asyncio.timeout(STEP_TIMEOUT):
                    await loop.sock_recv(conn, MAX_MESSAGE)
                _send(conn, {"error": "permission denied: only the balancer's own user may take over"})
                return
            await self._exchange(loop, conn)
        except (OSError, TimeoutError, ValueError, BalancerError) as exc:  # this session only: A keeps serving
            log.warning("handover socket: session ended: %s", exc)
        finally:
            conn.close()

    async def _exchange(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        """One takeover at a time: a session holds it from ``listeners`` to
        its end (a connection that asks nothing holds nothing)."""
        try:
            while True:
                async with asyncio.timeout(STEP_TIMEOUT):
                    data = await loop.sock_recv(conn, MAX_MESSAGE)
                if not data:
                    return  # the new process gave up (or failed to start): keep serving
                try:
                    op = json.loads(data).get("op")
                except (ValueError, AttributeError):
                    op = None
                if op == "listeners":
                    if self._done or self._owner not in (None, conn):
                        _send(conn, {"error": "another takeover is under way"})
                        return
                    self._owner = conn
                    self._send_listeners(conn)
                elif op == "drain" and self._owner is conn:
                    self._done = True
                    log.info("listeners taken over by a new process: draining")
                    # closed first: once told, the new process may open the same path for its own
                    self.close_listener()
                    _send(conn, {"ok": True})
                    self._on_drain()
                    return
                else:
                    _send(conn, {"error": 'expected {"op": "listeners"}, then {"op": "drain"}'})
                    return
        finally:
            if self._owner is conn:
                self._owner = None

    def close_listener(self) -> None:
        """Stop taking new sessions (those under way go on); the path goes."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)

    def _send_listeners(self, conn: socket.socket) -> None:
        listeners = self._sockets()
        try:
            for key, tls, fds in listeners:
                for i in range(0, len(fds), FDS_PER_MESSAGE):
                    _send(conn, {"listener": key, "tls": tls}, fds[i:i + FDS_PER_MESSAGE])
            _send(conn, {"done": len(listeners)})
        finally:
            for _, _, fds in listeners:
                for fd in fds:
                    os.close(fd)


def _clear_stale(path: str) -> None:
    """Remove a socket file left by a process that is gone; refuse a path
    that is something else or that a live process serves."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HandoverError(f"cannot open the handover socket {path}: the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except OSError:
        return  # let bind() say what is wrong
    finally:
        probe.close()
    raise HandoverError(f"cannot open the handover socket {path}: a running balancer serves it "
                        f"(start with --takeover {path} to replace it)")


def _connect_failure(exc: OSError) -> str:
    """Why connecting to a handover socket failed, in the user's terms."""
    if isinstance(exc, FileNotFoundError):
        return "no such socket (is the running balancer started with handover_socket?)"
    if isinstance(exc, ConnectionRefusedError):
        return "no balancer is serving it"
    if isinstance(exc, PermissionError):
        return "permission denied (run as the user of the running balancer)"
    if exc.errno == errno.EPROTOTYPE:  # a stream socket: something else listens there
        return "not a balancer's handover socket"
    return exc.strerror or str(exc)


class Takeover:
    """The new side, before its event loop serves anything (blocking calls,
    bounded by ``timeout``): ``connect()``, ``listeners()``, then ``drain()``
    once started, or ``close()`` to give up (the old process keeps serving)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None

    def connect(self) -> None:
        with contextlib.suppress(OSError):
            if not stat.S_ISSOCK(os.stat(self.path).st_mode):
                raise HandoverError(f"cannot take over from {self.path}: not a socket")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise HandoverError(f"cannot take over from {self.path}: {_connect_failure(exc)}") from exc
        self._sock = sock

    def _recv(self) -> tuple[dict[str, Any], list[int]]:
        assert self._sock is not None
        try:
            data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, FDS_PER_MESSAGE)
        except TimeoutError as exc:
            raise HandoverError(f"cannot take over from {self.path}: no answer within {self.timeout:g} s") from exc
        except OSError as exc:
            raise HandoverError(f"cannot take over from {self.path}: {exc.strerror or exc}") from exc
        if not data:
            raise HandoverError(f"cannot take over from {self.path}: the running balancer closed the connection")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            for fd in fds:
                os.close(fd)
            raise HandoverError(f"cannot take over from {self.path}: not a balancer's handover socket")
        if "error" in msg:
            for fd in fds:
                os.close(fd)
            raise HandoverError(f"cannot take over from {self.path}: {msg['error']}")
        return msg, fds

    def listeners(self) -> dict[str, list[int]]:
        """The running process's listening sockets by listener key; the
        descriptors are the caller's to close."""
        assert self._sock is not None
        out: dict[str, list[int]] = {}
        try:
            self._sock.send(json.dumps({"op": "listeners"}).encode())
            while True:
                msg, fds = self._recv()
                if "done" in msg:
                    return out
                out.setdefault(str(msg.get("listener")), []).extend(fds)
        except BaseException:
            close_fds(out)
            raise

    def drain(self) -> None:
        """Tell the running process to stop accepting and drain."""
        assert self._sock is not None
        try:
            self._sock.send(json.dumps({"op": "drain"}).encode())
        except OSError as exc:
            raise HandoverError(f"cannot tell the running balancer to drain: {exc.strerror or exc}") from exc
        msg, fds = self._recv()
        for fd in fds:
            os.close(fd)
        if not msg.get("ok"):
            raise HandoverError("the running balancer did not confirm the drain")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def close_fds(listeners: dict[str, list[int]]) -> None:
    for fds in listeners.values():
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
