"""The engine of ``juggler client``: commands over numbered connections.

One :class:`Repl` holds connections numbered from 1 and runs one command
line at a time (``await repl.execute(line)``); incoming messages are printed
through the `out` callable as they arrive. ``cli/client.py`` drives it from
a prompt_toolkit prompt (a terminal) or from lines of stdin (a pipe).

Better than the original REPL (vectors/juggler/repl_session.txt):

- ARGS are JSON as typed: ``"500"`` sends the JSON string ``"500"``, ``500``
  the number, ``{"a":1}`` the object; raw JSON may also be put between
  backticks. Anything else (a typo, a string without its quotes, a
  malformed duration) is refused with a message and nothing is sent.
- It works when stdin is a pipe: then each command waits for its outcome
  (ACK/NACK, the RES or the local expiry of a call) before the next one, so
  scripts are deterministic; ``wait ID [TIMEOUT]`` waits for an event.
- Errors are printed as ``(error) ...`` (through ``err``: stderr in pipe
  mode) and the session goes on; :attr:`Repl.failures` counts them, with
  NACKs, expired calls and lost connections, for the exit status.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from juggler.client import (
    ACK,
    CALL,
    EVNT,
    NACK,
    RES,
    SUB,
    SUBPROTOCOL,
    TYPE_NAMES,
    UNSB,
    Client,
    connect,
    new_uuid,
)
from juggler.errors import CallExpired, CallNacked, ConnectionClosed, JugglerError

__all__ = ["COMMANDS", "DEFAULT_URL", "Repl", "ReplError", "parse_args_json", "parse_duration"]

DEFAULT_URL = "ws://127.0.0.1:9000/ws"
CONNECT_USAGE = "connect [--tls-ca FILE | --insecure] [URL [PROTO]]"
DEFAULT_CALL_TIMEOUT = 5.0

HELP = """commands (connections are numbered from 1):
  help | ?                          this help
  exit                              leave (or Ctrl-D)
  connect [URL [PROTO]]             open a connection [ws://127.0.0.1:9000/ws, juggler.0]
    [--tls-ca FILE]                   wss://: verify the server with this CA
    [--insecure]                      wss://: do not verify the server (a self-signed
                                      development server only: anyone could be it)
  disconnect ID                     drop connection ID without a close handshake
  close ID [TEXT]                   close connection ID (code 1000, reason TEXT)
  send ID RAWTEXT                   send RAWTEXT as a text frame
  rand ID [NBYTES]                  send NBYTES random bytes as a binary frame [100]
  call ID URI [TIMEOUT [ARGS]]      call URI; TIMEOUT like 5s, 100ms, 1m [5s]
  pub ID CHANNEL [ARGS]             publish ARGS on CHANNEL
  sub | psub ID CHANNEL             subscribe to a channel | a pattern (news.*)
  unsb | punsb ID CHANNEL           unsubscribe from a channel | a pattern
  wait ID [TIMEOUT]                 wait for the next event on ID, or its closing [5s]
  sleep DURATION                    pause (scripts)
  list                              the open connections
ARGS: JSON as typed ("500" is a string, 500 a number, {"a":1} an object),
or raw JSON between backticks; anything else is refused, not sent."""

COMMANDS = (
    "help", "?", "exit", "connect", "disconnect", "close", "send", "rand", "call",
    "pub", "sub", "psub", "unsb", "punsb", "wait", "sleep", "list",
)

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ReplError(JugglerError):
    """A command the REPL cannot run (printed as ``(error) ...``)."""


def parse_duration(text: str) -> float:
    """Go-style duration (``5s``, ``100ms``, ``1m30s``, ``1.5s``) in seconds."""
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ReplError(f"invalid duration {text!r} (e.g. 5s, 100ms, 1m30s)")
    return total


def _strict_json(text: str) -> None:
    """json.loads, minus Python's NaN/Infinity extensions (not JSON)."""

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    json.loads(text, parse_constant=no_constants)


def parse_args_json(text: str) -> str:
    """The JSON text to send for ARGS as typed (see the module doc);
    :class:`ReplError` when it is not JSON."""
    text = text.strip()
    quoted = len(text) >= 2 and text.startswith("`") and text.endswith("`")
    raw = text[1:-1].strip() if quoted else text
    try:
        _strict_json(raw)
    except ValueError as exc:
        hint = "" if raw[:1] in '"[{' or raw[:1].isdigit() or raw[:1] == "-" else \
            f' (a string needs quotes: "{raw}")'
        raise ReplError(f"ARGS is not JSON: {exc}{hint}; nothing sent") from None
    return raw


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(eq=False)
class _Conn:
    id: int
    url: str
    client: Client
    events_seen: int = 0
    events_waited: int = 0
    event_signal: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None


class Repl:
    """Run REPL command lines; `out` prints one line (above the prompt)."""

    def __init__(self, out: Callable[[str], None] = print, *, wait_outcomes: bool = False,
                 default_url: str = DEFAULT_URL, err: Callable[[str], None] | None = None,
                 tls: Any = None) -> None:
        self.out = out
        #: where errors go (``out`` unless given: stderr in pipe mode)
        self.err = err or out
        self.wait_outcomes = wait_outcomes
        self.default_url = default_url
        #: how wss:// servers are verified (rustext.tls.ClientTls), None: the system's trust store
        self.tls = tls
        #: commands that failed: errors, NACKs, expired calls, lost connections
        self.failures = 0
        self.conns: dict[int, _Conn] = {}
        self._next_id = 1
        self._background: set[asyncio.Task[Any]] = set()

    # entry points -------------------------------------------------------------------

    async def execute(self, line: str) -> bool:
        """Run one command line; False means "exit". Never raises for a bad command."""
        line = line.strip()
        if not line or line.startswith("#"):
            return True
        name, _, rest = line.partition(" ")
        name = name.lower()
        if name in ("exit", "quit"):
            return False
        if name == "?":
            name = "help"
        handler = getattr(self, f"do_{name}", None)
        if handler is None:
            self._fail(f"(error) unknown command {name!r}; enter ? or help for the commands")
            return True
        try:
            outcome = await handler(rest.strip())
            if outcome is not None:
                if self.wait_outcomes:
                    await outcome
                else:
                    task = asyncio.ensure_future(outcome)
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
        except (ReplError, JugglerError, OSError, ValueError) as exc:
            self._fail(f"(error) {exc}")
        return True

    def _fail(self, line: str) -> None:
        self.failures += 1
        self.err(line)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        for conn in list(self.conns.values()):
            await conn.client.aclose()
            if conn.watcher is not None:
                conn.watcher.cancel()
        self.conns.clear()

    # helpers ---------------------------------------------------------------------

    def _conn(self, token: str) -> _Conn:
        try:
            conn = self.conns.get(int(token))
        except ValueError:
            conn = None
        if conn is None:
            raise ReplError(f"invalid connection ID: {token}")
        return conn

    def _split(self, rest: str, n: int, usage: str) -> list[str]:
        """First `n` whitespace-separated words, then the rest of the line as is."""
        parts = rest.split(None, n)
        if len(parts) < n:
            raise ReplError(f"usage: {usage}")
        return parts

    def _print_message(self, conn_id: int, msg: dict[str, Any]) -> None:
        meta = msg.get("meta", {})
        p = msg.get("payload") or {}
        t = meta.get("type")
        name = TYPE_NAMES.get(t, str(t))
        head = f"[{conn_id}] <<< {name:<4} message: {meta.get('uuid')}"
        if t in (ACK, NACK):
            ft = TYPE_NAMES.get(p.get("for_type"), str(p.get("for_type")))
            target = p.get("uri") if p.get("for_type") == CALL else p.get("channel")
            line = f"{head} for {ft} {p.get('for')} ({target})"
            if t == NACK:
                line += f" {p.get('code')}: {p.get('message')}"
            elif p.get("epoch") is not None:  # a SUB to a channel with history
                line += f" at offset {p.get('offset')} epoch {p['epoch']}"
                if p.get("recovered") is not None:
                    line += " recovered" if p["recovered"] else " NOT recovered"
        elif t == RES:
            line = f"{head} for CALL {p.get('for')} ({p.get('uri')}): {_show(p.get('args'))}"
        elif t == EVNT and (p.get("join") is not None or p.get("leave") is not None):
            kind = "join" if p.get("join") is not None else "leave"
            line = f"{head} on {p.get('channel')}: {kind} {_show(p[kind])}"
        elif t == EVNT and p.get("recovered") is False:
            line = (f"{head} on {p.get('channel')}: events lost, NOT recovered "
                    f"(now at offset {p.get('offset')} epoch {p.get('epoch')})")
        elif t == EVNT:
            via = f" via pattern {p['pattern']}" if p.get("pattern") else ""
            at = f" #{p['offset']}" if p.get("offset") is not None else ""
            line = f"{head} for PUB {p.get('for')} on {p.get('channel')}{at}{via}: {_show(p.get('args'))}"
        else:
            line = f"{head}: {_show(p)}"
        self.out(line)

    async def _watch(self, conn: _Conn) -> None:
        await conn.client.wait_closed()
        if self.conns.get(conn.id) is conn:
            del self.conns[conn.id]
            exc = conn.client._closed_exc
            self.out(f"[{conn.id}] {exc or 'connection closed'}")
        conn.event_signal.set()

    # commands --------------------------------------------------------------------------

    async def do_help(self, rest: str) -> None:
        self.out(HELP)

    async def do_list(self, rest: str) -> None:
        if not self.conns:
            self.out("no open connection")
        for cid, c in sorted(self.conns.items()):
            self.out(f"[{cid}] {c.url} ({c.client.subprotocol or 'no subprotocol'})")

    async def do_sleep(self, rest: str) -> None:
        await asyncio.sleep(parse_duration(rest.strip() or "1s"))

    async def do_connect(self, rest: str) -> None:
        words, tls = self._tls_options(rest.split())
        if len(words) > 2:
            raise ReplError(f"usage: {CONNECT_USAGE}")
        url = words[0] if words else self.default_url
        if not url.startswith(("ws://", "wss://")):
            raise ReplError(f"URL must start with ws:// or wss://, got {url!r}")
        if tls is not None and not url.startswith("wss://"):
            raise ReplError("--tls-ca and --insecure are for wss:// URLs")
        proto = words[1] if len(words) > 1 else SUBPROTOCOL
        cid = self._next_id
        holder: list[_Conn] = []

        def on_message(msg: dict[str, Any], _frame: str) -> None:
            self._print_message(cid, msg)
            if msg.get("meta", {}).get("type") == EVNT and holder:
                holder[0].events_seen += 1
                holder[0].event_signal.set()

        if tls is None:
            tls = self.tls if url.startswith("wss://") else None
        try:
            client = await connect(url, subprotocols=[proto], on_message=on_message, default_timeout=DEFAULT_CALL_TIMEOUT,
                                   tls=tls)
        except JugglerError as exc:
            raise ReplError(f"dial failed: {exc}") from None
        self._next_id += 1
        conn = _Conn(id=cid, url=url, client=client)
        holder.append(conn)
        self.conns[cid] = conn
        unverified = "; the server's certificate was NOT verified (--insecure)" if getattr(tls, "insecure", False) else ""
        self.out(f"[{cid}] connected to {url} ({client.subprotocol or 'no subprotocol'}{unverified})")
        conn.watcher = asyncio.create_task(self._watch(conn))

    def _tls_options(self, words: list[str]) -> tuple[list[str], Any]:
        """``--tls-ca FILE`` and ``--insecure`` taken out of a connect line:
        (the other words, a ClientTls or None when neither was given)."""
        from rustext.tls import ClientTls

        rest: list[str] = []
        ca: str | None = None
        insecure = False
        it = iter(words)
        for word in it:
            if word == "--tls-ca":
                ca = next(it, None)
                if ca is None:
                    raise ReplError("--tls-ca needs a FILE (the PEM CA certificate that signed the server's)")
                ca = os.path.expanduser(ca)
            elif word == "--insecure":
                insecure = True
            elif word.startswith("-"):
                raise ReplError(f"unknown option {word!r}; usage: {CONNECT_USAGE}")
            else:
                rest.append(word)
        if ca is None and not insecure:
            return rest, None
        if ca is not None and insecure:
            raise ReplError("--tls-ca and --insecure exclude each other")
        tls = ClientTls(ca=ca, insecure=insecure)
        tls.context()  # a bad file is named now
        return rest, tls

    async def do_disconnect(self, rest: str) -> None:
        conn = self._conn(rest.strip())
        transport = conn.client.ws.transport
        transport.abort()
        await conn.client.wait_closed()
        if conn.watcher is not None:
            await conn.watcher

    async def do_close(self, rest: str) -> None:
        cid, _, text = rest.partition(" ")
        conn = self._conn(cid)
        await conn.client.aclose(1000, text.strip())
        if conn.watcher is not None:
            await conn.watcher

    async def do_send(self, rest: str) -> None:
        cid, _, text = rest.partition(" ")
        conn = self._conn(cid)
        if not text:
            raise ReplError("usage: send ID RAWTEXT")
        await conn.client.send_raw(text)
        self.out(f"[{conn.id}] >>> {len(text.encode())} bytes of text")

    async def do_rand(self, rest: str) -> None:
        words = rest.split()
        if not words or len(words) > 2:
            raise ReplError("usage: rand ID [NBYTES]")
        conn = self._conn(words[0])
        try:
            n = int(words[1]) if len(words) > 1 else 100
        except ValueError:
            raise ReplError(f"invalid NBYTES: {words[1]}") from None
        if not 0 < n <= 16 * 1024 * 1024:
            raise ReplError("NBYTES must be between 1 and 16777216")
        await conn.client.send_raw(os.urandom(n))
        self.out(f"[{conn.id}] >>> {n} random bytes (binary frame)")

    async def do_call(self, rest: str) -> Awaitable[None] | None:
        parts = self._split(rest, 2, "call ID URI [TIMEOUT [ARGS]]")
        conn = self._conn(parts[0])
        uri = parts[1]
        timeout = DEFAULT_CALL_TIMEOUT
        raw_args: str | None = None
        if len(parts) > 2:
            tail = parts[2]
            first, _, after = tail.partition(" ")
            try:
                timeout = parse_duration(first)
                tail = after
            except ReplError:
                # no TIMEOUT: the whole tail is ARGS, unless it is neither (5q "x")
                if _looks_like_duration(first) and not _is_json(tail):
                    raise
            if tail.strip():
                raw_args = parse_args_json(tail)
        if timeout <= 0:
            raise ReplError("TIMEOUT must be > 0")
        msg_uuid = new_uuid()
        call = conn.client.call(uri, timeout=timeout, raw_args=raw_args, msg_uuid=msg_uuid)
        self.out(f"[{conn.id}] >>> CALL message: {msg_uuid} ({uri}, timeout {first_word_duration(timeout)})")
        return self._outcome(conn.id, "CALL", msg_uuid, call, timeout)

    async def _outcome(self, cid: int, what: str, msg_uuid: str, aw: Awaitable[Any], timeout: float) -> None:
        try:
            await aw
        except CallExpired:
            self._fail(f"[{cid}] {what} {msg_uuid} expired: nothing answered within {first_word_duration(timeout)}")
        except CallNacked:
            self.failures += 1  # the NACK itself is printed as it arrives
        except TimeoutError:
            self._fail(f"[{cid}] {what} {msg_uuid}: no ACK within {first_word_duration(timeout)}")
        except ConnectionClosed as exc:
            self._fail(f"[{cid}] {what} {msg_uuid}: {exc}")

    async def do_pub(self, rest: str) -> Awaitable[None] | None:
        parts = self._split(rest, 2, "pub ID CHANNEL [ARGS]")
        conn = self._conn(parts[0])
        raw_args = parse_args_json(parts[2]) if len(parts) > 2 and parts[2].strip() else None
        msg_uuid = new_uuid()
        aw = conn.client.pub(parts[1], raw_args=raw_args, msg_uuid=msg_uuid, timeout=DEFAULT_CALL_TIMEOUT)
        self.out(f"[{conn.id}] >>> PUB  message: {msg_uuid} ({parts[1]})")
        return self._outcome(conn.id, "PUB", msg_uuid, aw, DEFAULT_CALL_TIMEOUT)

    async def _subunsb(self, rest: str, msg_type: int, pattern: bool, usage: str) -> Awaitable[None] | None:
        words = rest.split()
        if len(words) != 2:
            raise ReplError(f"usage: {usage}")
        conn = self._conn(words[0])
        msg_uuid = new_uuid()
        client = conn.client
        method = client.sub if msg_type == SUB else client.unsb
        aw = method(words[1], pattern, timeout=DEFAULT_CALL_TIMEOUT, msg_uuid=msg_uuid)
        name = TYPE_NAMES[msg_type]
        self.out(f"[{conn.id}] >>> {name} message: {msg_uuid} ({words[1]}{', pattern' if pattern else ''})")
        return self._outcome(conn.id, name, msg_uuid, aw, DEFAULT_CALL_TIMEOUT)

    async def do_sub(self, rest: str) -> Awaitable[None] | None:
        return await self._subunsb(rest, SUB, False, "sub ID CHANNEL")

    async def do_psub(self, rest: str) -> Awaitable[None] | None:
        return await self._subunsb(rest, SUB, True, "psub ID PATTERN")

    async def do_unsb(self, rest: str) -> Awaitable[None] | None:
        return await self._subunsb(rest, UNSB, False, "unsb ID CHANNEL")

    async def do_punsb(self, rest: str) -> Awaitable[None] | None:
        return await self._subunsb(rest, UNSB, True, "punsb ID PATTERN")

    async def do_wait(self, rest: str) -> None:
        words = rest.split()
        if not words or len(words) > 2:
            raise ReplError("usage: wait ID [TIMEOUT]")
        timeout = parse_duration(words[1]) if len(words) > 1 else 5.0
        if words[0].isdigit() and 0 < int(words[0]) < self._next_id and int(words[0]) not in self.conns:
            # it closed already: that is the event waited for (its closing line was printed)
            self.out(f"[{int(words[0])}] wait: the connection is closed")
            return
        conn = self._conn(words[0])
        try:
            async with asyncio.timeout(timeout):
                while conn.events_seen <= conn.events_waited and not conn.client.closed:
                    conn.event_signal.clear()
                    await conn.event_signal.wait()
        except TimeoutError:
            # an outcome, printed where events are (stdout), and a failure for the exit status
            self.failures += 1
            self.out(f"[{conn.id}] wait: no event within {first_word_duration(timeout)} (timed out)")
            return
        if conn.events_seen > conn.events_waited:
            conn.events_waited += 1
        elif conn.watcher is not None:
            await conn.watcher  # closed: its line is printed before the next command


def _looks_like_duration(word: str) -> bool:
    return bool(word) and (word[0].isdigit() or word[0] == ".") and not _is_json(word)


def _is_json(text: str) -> bool:
    try:
        _strict_json(text.strip())
    except ValueError:
        return False
    return True


def first_word_duration(seconds: float) -> str:
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds * 1000:g}ms"

