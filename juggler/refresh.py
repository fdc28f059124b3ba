"""Token expiry on live connections, sans-I/O: when the server warns a
connection (or a private subscription) that its credentials expire, when
it asks a refresher, and when it ends what was not renewed in time.

No socket, task or timer here: times are unix seconds (a token's ``exp``
is one), passed in; :mod:`juggler.refreshing` drives this with one timer
per connection.

**The rules** (:class:`Expiry`, one per connection):

- A connection whose identity has an ``exp`` is *warned* ``warn_ahead``
  seconds before it — at most half-way through what was left of the token's
  life when it was accepted, so that a short-lived token still leaves its
  client time to act. Warned means: the server's refresher is asked, when
  one is configured; else a client that opted in at the handshake
  (``Juggler-Refresh: 1`` header or ``juggler-refresh=1`` query parameter)
  is sent EXPIRING ``{"expires_in_ms": N}`` (type 258); one that did not
  is sent nothing.
- A REFRESH with a valid token (or the refresher) moves the expiry; the
  warning is then due again before the new one. No ``exp`` any more (a
  token without one, a refresher that gives none): nothing is timed.
- Not renewed by ``exp + grace``: the connection is closed with
  :data:`CLOSE_CODE` (4001), reason ``token expired``, counted as
  ``token_expired``; unless ``close_expired`` is off, in which case it
  stays and every later CALL/PUB/SUB gets NACK 401 as before.
- A subscription to a private channel carries the ``exp`` of its
  subscription token: warned the same way (EXPIRING ``{"channel": C,
  "expires_in_ms": N}``, to opted-in clients), renewed by SUB_REFRESH, and
  ended by the server at ``exp + grace`` (the connection stays): an
  opted-in client is told with EXPIRING ``{"channel": C, "expires_in_ms":
  0, "unsubscribed": true}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import rustext
from juggler.extensions import EXPIRING

_SUB = rustext.SUB
#: the longest uuid form the codec accepts (``urn:uuid:`` + 36)
_MAX_UUID = 45

__all__ = [
    "CLOSE",
    "CLOSE_CODE",
    "CLOSE_REASON",
    "CLOSE_TEXT",
    "END_SUB",
    "HEADER",
    "QUERY",
    "REFRESH_HOOK",
    "WARN",
    "Due",
    "Expiry",
    "ExpiryRules",
    "SubKey",
    "expiring_frame",
    "expiring_notice",
    "sub_token",
]

#: the handshake header a client asks for EXPIRING messages with
HEADER = "Juggler-Refresh"
#: the query parameter of the websocket URL that asks for them (browsers cannot send headers)
QUERY = "juggler-refresh"

#: the websocket close code of a connection whose token expired (the private range, 4000-4999)
CLOSE_CODE = 4001
#: the close frame's reason text
CLOSE_TEXT = "token expired"
#: the close reason counted in ``juggler_connections_closed_total{reason}``
CLOSE_REASON = "token_expired"

#: what is due (:attr:`Due.what`): warn the client (EXPIRING), or for a subscription
WARN = "warn"
#: ask the server's refresher for new credentials (connections only)
REFRESH_HOOK = "refresh"
#: the connection's token expired: close it
CLOSE = "close"
#: a private subscription's token expired: end it
END_SUB = "end_sub"


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpiryRules:
    """The server's choices (the ``[auth]`` options of the same names)."""

    #: seconds before ``exp`` the warning goes out (at most half the token's remaining life)
    warn_ahead: float = 30.0
    #: seconds after ``exp`` a renewal is still waited for
    grace: float = 0.0
    #: close a connection whose token expired (off: it stays, its messages get NACK 401)
    close_expired: bool = True
    #: a refresher is configured: it is asked instead of the client being warned
    refresher: bool = False

    def __post_init__(self) -> None:
        if self.warn_ahead < 0 or self.grace < 0:
            raise ValueError("warn_ahead and grace must be >= 0")


#: a subscription: (pattern, channel or pattern)
SubKey = tuple[bool, str]


@dataclass(frozen=True, slots=True)
class Due:
    """One thing to do now: ``what`` for the connection (``sub`` None) or a subscription."""

    what: str
    sub: SubKey | None = None
    #: seconds until the expiry (WARN, REFRESH_HOOK)
    expires_in: float = 0.0


class _Timed:
    """One expiring credential: its exp, when to warn, whether warned."""

    __slots__ = ("exp", "warn_at", "warned")

    def __init__(self, exp: float, now: float, ahead: float) -> None:
        self.exp = exp
        self.warn_at = exp - min(ahead, max(0.0, exp - now) / 2)
        self.warned = False


class Expiry:
    """The expiry rules for one connection and its private subscriptions
    (see the module doc). The driver calls :meth:`tick` at
    :meth:`next_deadline` (or later) and does what it returns; a late tick
    is harmless: what is due is done then."""

    __slots__ = ("_conn", "_subs", "rules")

    def __init__(self, rules: ExpiryRules, exp: float | None, now: float) -> None:
        self.rules = rules
        self._conn: _Timed | None = None
        self._subs: dict[SubKey, _Timed] = {}
        self.renewed(exp, now)

    # --- changes -----------------------------------------------------------------------

    def renewed(self, exp: float | None, now: float) -> None:
        """The connection's credentials now expire at `exp` (None: never)."""
        self._conn = None if exp is None else _Timed(exp, now, self.rules.warn_ahead)

    def sub_renewed(self, sub: SubKey, exp: float | None, now: float) -> None:
        """A private subscription's token expires at `exp` (None: never)."""
        if exp is None:
            self._subs.pop(sub, None)
        else:
            self._subs[sub] = _Timed(exp, now, self.rules.warn_ahead)

    def sub_ended(self, sub: SubKey) -> None:
        """The subscription is gone (UNSB, or ended by the server)."""
        self._subs.pop(sub, None)

    @property
    def exp(self) -> float | None:
        """When the connection's credentials expire (None: never)."""
        return None if self._conn is None else self._conn.exp

    def timed(self, sub: SubKey) -> bool:
        """Whether the subscription's token is timed (a private subscription with an exp)."""
        return sub in self._subs

    def sub_exp(self, sub: SubKey) -> float | None:
        t = self._subs.get(sub)
        return None if t is None else t.exp

    # --- decisions ---------------------------------------------------------------------

    def tick(self, now: float) -> list[Due]:
        """What is due at `now` (each warning once per expiry)."""
        due: list[Due] = []
        rules = self.rules
        c = self._conn
        if c is not None:
            if now >= c.exp + rules.grace:
                if rules.close_expired:
                    self._conn = None
                    return [Due(CLOSE)]
                self._conn = None  # stays; Identity.check NACKs it from now on
            elif not c.warned and now >= c.warn_at:
                c.warned = True
                due.append(Due(REFRESH_HOOK if rules.refresher else WARN, None, max(0.0, c.exp - now)))
        for sub, t in list(self._subs.items()):
            if now >= t.exp + rules.grace:
                del self._subs[sub]
                due.append(Due(END_SUB, sub))
            elif not t.warned and now >= t.warn_at:
                t.warned = True
                due.append(Due(WARN, sub, max(0.0, t.exp - now)))
        return due

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has something to do next (None: nothing to time)."""
        t = math.inf
        grace = self.rules.grace
        for timed in (self._conn, *self._subs.values()):
            if timed is None:
                continue
            end = timed.exp + grace
            t = min(t, end if timed.warned else min(timed.warn_at, end))
        return None if t == math.inf else t


def expiring_frame(msg_uuid: str, expires_in: float, sub: SubKey | None = None) -> bytes:
    """The EXPIRING message warning a client (seconds until the expiry) about
    its connection, or about subscription `sub`."""
    payload: dict[str, Any] = {"expires_in_ms": max(0, round(expires_in * 1000))}
    if sub is not None:
        payload["channel"] = sub[1]
        if sub[0]:
            payload["pattern"] = True
    return _frame(msg_uuid, payload)


def expiring_notice(msg_uuid: str, sub: SubKey) -> bytes:
    """The EXPIRING message telling a client the server ended its subscription `sub`."""
    payload: dict[str, Any] = {"channel": sub[1], "expires_in_ms": 0, "unsubscribed": True}
    if sub[0]:
        payload["pattern"] = True
    return _frame(msg_uuid, payload)


def sub_token(data: bytes | str) -> tuple[str, Any] | None:
    """The (canonical uuid, token) of a SUB frame whose payload has a ``token``
    field, or None for any other frame, valid or not (the codec judges it)."""
    try:
        msg = json.loads(data)
        meta, payload = msg["meta"], msg["payload"]
        if meta["type"] != _SUB or meta["type"].__class__ is not int or "token" not in payload:
            return None
        msg_uuid = meta["uuid"]
        if not isinstance(msg_uuid, str) or len(msg_uuid) > _MAX_UUID or not isinstance(payload, dict):
            return None
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, RecursionError):
        return None
    canonical = rustext.canonical_uuid(msg_uuid)
    return None if canonical is None else (canonical, payload["token"])


def _frame(msg_uuid: str, payload: dict[str, Any]) -> bytes:
    text = json.dumps({"meta": {"type": EXPIRING, "uuid": msg_uuid}, "payload": payload},
                      separators=(",", ":"), ensure_ascii=False)
    return text.encode() + b"\n"
