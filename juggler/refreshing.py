"""Token refresh on live connections, and subscription tokens for private
channels: the server's side (the rules are :mod:`juggler.refresh`).

::

    TokenRefresh(server.auth, server.channels, rules, refresher=None).install(server)

``install`` makes the server answer REFRESH (257) and SUB_REFRESH (259)
(:mod:`juggler.extensions`) and gives every connection a
:class:`ConnExpiry`: one timer at most, re-armed to the next deadline of the
connection's token or of its private subscriptions' tokens; a task exists
only while a refresher is asked or a subscription is being ended.

- **REFRESH** ``{"token": T}``: T is verified as the handshake's token (the
  same verifier, audience, issuer, leeway) and must name the connection's
  ``sub``; a token with a ``channel`` claim (a subscription token) is
  refused. REPLY ``{"expires_at": unix seconds or null}``: the connection's
  identity (its expiry and its grants) is now T's. NACK 400 without auth
  on the server or without a token in the payload, 401 for an anonymous
  connection or an invalid token (the connection stays until its old
  expiry), 403 for another subject.
- **Private channels** (``private = true`` in a ``[[channels]]`` table): a
  SUB needs a ``token`` in its payload (a field the original server
  ignores), a token verified as above whose ``channel`` claim is the SUB's
  channel and whose ``sub`` is the connection's; else NACK 403. When the
  server has private channels, a pattern SUB needs one too (its
  ``channel`` claim is the pattern): a pattern may cover private channels.
- **SUB_REFRESH** ``{"channel": C, "token": T[, "pattern": true]}``
  renews a private subscription: REPLY ``{"expires_at": …}``; NACK 400 when
  there is no such subscription, 403 for an invalid token.
- **The refresher** (:class:`Refresher`): when one is configured, it is
  asked for new credentials at warning time instead of the client; it
  answers a :class:`RefreshOutcome`. Refused: the connection is closed as
  expired. An error: the client is warned instead (EXPIRING, if it opted
  in), and the connection closes at its expiry unless renewed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import rustext
from juggler.auth import Auth, AuthError, Identity
from juggler.channels import ChannelRules
from juggler.extensions import (
    EXPIRING,
    REFRESH,
    REPLY,
    SUB_REFRESH,
    ExtensionMessage,
    reply_frame,
)
from juggler.refresh import (
    CLOSE,
    CLOSE_CODE,
    CLOSE_REASON,
    CLOSE_TEXT,
    END_SUB,
    REFRESH_HOOK,
    WARN,
    Expiry,
    ExpiryRules,
    SubKey,
    expiring_frame,
    expiring_notice,
    sub_token,
)
from rustext.tokens import TokenError, UnknownKey

if TYPE_CHECKING:
    from juggler.conn import Conn
    from juggler.server import Server

__all__ = ["ConnExpiry", "RefreshOutcome", "Refresher", "TokenRefresh", "rules_of"]

log = logging.getLogger("juggler.refresh")

#: subscription tokens of SUBs not handled yet, kept per connection at most (older ones forgotten)
_MAX_SUB_TOKENS = 256


@dataclass(frozen=True, slots=True)
class RefreshOutcome:
    """A refresher's answer: new credentials, or a refusal."""

    #: when the renewed credentials expire (unix seconds); None: never
    expire_at: float | None = None
    #: what the application says of the connection now (kept as :attr:`ConnExpiry.info`)
    info: Any = None
    #: no renewal: the connection is closed as expired
    refused: bool = False


class Refresher(Protocol):
    """Renews a connection's credentials from the server's side (a refresh
    proxy to the application's backend, say) when they near expiry."""

    async def refresh(self, conn: Conn, identity: Identity) -> RefreshOutcome: ...


def rules_of(config: Any, *, refresher: bool = False) -> ExpiryRules:
    """The expiry rules an ``[auth]`` configuration (AuthConfig) chooses."""
    return ExpiryRules(
        warn_ahead=getattr(config, "refresh_warning", 30.0),
        grace=getattr(config, "expiry_grace", 0.0),
        close_expired=getattr(config, "close_expired", True),
        refresher=refresher,
    )


class TokenRefresh:
    """A server's token refresh (see the module doc)."""

    def __init__(self, auth: Auth | None, channels: ChannelRules, rules: ExpiryRules | None = None, *,
                 refresher: Refresher | None = None, refresh_timeout: float = 10.0,
                 proxied: bool = False) -> None:
        self.auth = auth if auth is not None and auth.enabled else None
        #: identities may come from a connect proxy, with an expiry of their own
        self.proxied = proxied
        self.channels = channels
        self.refresher = refresher
        base = rules or rules_of(auth.config if auth is not None else None)
        self.rules = dataclasses.replace(base, refresher=refresher is not None)
        #: longest wait for the refresher (also bounded by the expiry)
        self.refresh_timeout = refresh_timeout
        #: the server has private channels (pattern SUBs then need a token too)
        self.private = any(rule.private for rule in channels.rules)

    def install(self, server: Server) -> TokenRefresh:
        """Answer REFRESH and SUB_REFRESH on `server`, and time its connections' tokens."""
        server.extensions[REFRESH] = self.on_refresh
        server.extensions[SUB_REFRESH] = self.on_sub_refresh
        server.conn_context = dataclasses.replace(server.conn_context, refresh=self)
        return self

    def attach(self, conn: Conn, messages: bool) -> ConnExpiry | None:
        """A connection was accepted; `messages`: it asked for EXPIRING messages.
        None on a server with neither authentication, nor private channels, nor
        a connect or refresh proxy (nothing to time)."""
        if self.auth is None and not self.private and not self.proxied and self.refresher is None:
            return None
        return ConnExpiry(self, conn, messages)

    def is_private(self, channel: str, pattern: bool) -> bool:
        if not self.private:
            return False
        return pattern or self.channels.lookup(channel).private

    async def verify(self, token: str, request: Any) -> Mapping[str, Any]:
        """The claims of `token`, verified as a handshake's; AuthError if invalid."""
        auth = self.auth
        if auth is None:
            raise AuthError("no authentication on this server", 400)
        if auth.verifier is not None:
            try:
                claims = auth.verifier(token, request)
            except Exception as exc:  # noqa: BLE001 - as at the handshake: any failure refuses
                raise AuthError(f"token refused: {exc}") from None
            if claims is None or claims is False:
                raise AuthError("token refused")
            if claims is True:
                return {}
            if not isinstance(claims, Mapping):
                raise AuthError("verifier returned no claims")
            return claims
        assert auth.tokens is not None
        try:
            return auth.tokens.verify(token)
        except UnknownKey as exc:
            if not auth.tokens.refetch_allowed():
                raise AuthError(str(exc)) from None
            try:
                return await auth.tokens.verify_fresh(token)
            except TokenError as exc2:
                raise AuthError(str(exc2)) from None
        except TokenError as exc:
            raise AuthError(str(exc)) from None

    # the extension requests -------------------------------------------------------------

    async def on_refresh(self, conn: Conn, msg: ExtensionMessage) -> None:
        """REFRESH ``{"token": T}``: the connection's identity becomes T's."""
        expiry: ConnExpiry | None = conn.expiry
        if self.auth is None or expiry is None:
            conn.nack(msg, 400, "no authentication on this server")  # type: ignore[arg-type]
            return
        identity = conn.identity
        if identity is None or identity.anonymous:
            conn.nack(msg, 401, "anonymous connection")  # type: ignore[arg-type]
            return
        token = msg.payload.get("token")
        if not isinstance(token, str) or not token:
            conn.nack(msg, 400, "REFRESH needs a token")  # type: ignore[arg-type]
            return
        try:
            claims = await self.verify(token, conn.request)
        except AuthError as exc:
            conn.nack(msg, 401, f"invalid token: {exc}")  # type: ignore[arg-type]
            return
        if conn.closed:
            return
        if "channel" in claims:
            # a subscription token: its grants (none named: everything) are not the connection's to take
            conn.nack(msg, 401, "invalid token: a subscription token is not a connection token")  # type: ignore[arg-type]
            return
        if _subject(claims) != _subject(identity.claims):
            conn.nack(msg, 403, "the token names another subject")  # type: ignore[arg-type]
            return
        assert self.auth is not None
        renewed = Identity(claims, self.auth._grants(claims))
        conn.identity = renewed
        expiry.renewed(renewed.exp)
        conn.reply(msg, (REPLY, msg.uuid, reply_frame(REFRESH, msg.uuid, {"expires_at": renewed.exp})))  # type: ignore[arg-type]

    async def on_sub_refresh(self, conn: Conn, msg: ExtensionMessage) -> None:
        """SUB_REFRESH ``{"channel": C, "token": T}``: the private subscription lives on."""
        expiry: ConnExpiry | None = conn.expiry
        pattern = msg.payload.get("pattern") is True
        key = (pattern, msg.channel)
        if expiry is None or not msg.channel or not expiry.private_subscription(key):
            conn.nack(msg, 400, "no private subscription to this channel")  # type: ignore[arg-type]
            return
        token = msg.payload.get("token")
        refusal = await expiry.check_token(token, msg.channel)
        if conn.closed:
            return
        if isinstance(refusal, tuple):
            conn.nack(msg, *refusal)  # type: ignore[arg-type]
            return
        if not expiry.private_subscription(key):  # ended meanwhile
            conn.nack(msg, 400, "no private subscription to this channel")  # type: ignore[arg-type]
            return
        expiry.sub_renewed(key, refusal)
        conn.reply(msg, (REPLY, msg.uuid, reply_frame(SUB_REFRESH, msg.uuid, {"expires_at": refusal})))  # type: ignore[arg-type]


def _subject(claims: Mapping[str, Any] | None) -> str | None:
    if claims is None:
        return None
    sub = claims.get("sub")
    return None if sub is None else str(sub)


class ConnExpiry:
    """One connection's expiring credentials: the :class:`~juggler.refresh.Expiry`
    rules, their one timer, and the subscription tokens of its SUBs."""

    __slots__ = ("_admitted", "_tasks", "_timer", "_tokens", "conn", "core", "info", "messages", "owner", "private")

    def __init__(self, owner: TokenRefresh, conn: Conn, messages: bool) -> None:
        self.owner = owner
        self.conn = conn
        #: the client asked for EXPIRING messages
        self.messages = messages
        #: the server has private channels: SUB frames may carry tokens
        self.private = owner.private
        identity = conn.identity
        self.core = Expiry(owner.rules, identity.exp if identity is not None else None, time.time())
        #: what the refresher last said of the connection
        self.info: Any = None
        self._timer: asyncio.TimerHandle | None = None
        # made when first needed: most connections never use them
        self._tasks: set[asyncio.Task[None]] | None = None  # a refresher asked, subscriptions being ended
        self._tokens: dict[str, Any] | None = None  # SUB uuid -> its payload's token
        self._admitted: dict[str, float | None] | None = None  # SUB uuid -> its token's exp, until subscribed
        self._arm()

    # what the connection tells ---------------------------------------------------------

    def frame_in(self, data: bytes) -> None:
        """A text frame that may be a SUB with a token: the token is kept for
        when the SUB's turn comes (the codec does not read the field)."""
        found = sub_token(data)
        if found is None:
            return  # not a SUB with a token (the codec says what is wrong with a bad frame)
        tokens = self._tokens
        if tokens is None:
            tokens = self._tokens = {}
        elif len(tokens) >= _MAX_SUB_TOKENS:
            del tokens[next(iter(tokens))]
        tokens[found[0]] = found[1]

    async def admit_sub(self, msg: Any) -> tuple[int, str] | None:
        """None when the SUB may go on (a private one with a valid token), else the NACK."""
        token = self._tokens.pop(msg.uuid, None) if self._tokens else None
        if not self.owner.is_private(msg.channel, msg.pattern):
            return None
        if token is None:
            self.conn.context.listener.reject("forbidden")
            return 403, "a subscription token is needed for this channel"
        checked = await self.check_token(token, msg.channel)
        if isinstance(checked, tuple):
            self.conn.context.listener.reject("forbidden")
            return checked
        admitted = self._admitted
        if admitted is None:
            admitted = self._admitted = {}
        elif len(admitted) >= _MAX_SUB_TOKENS:
            del admitted[next(iter(admitted))]
        admitted[msg.uuid] = checked
        return None

    async def check_token(self, token: Any, channel: str) -> tuple[int, str] | float | None:
        """The exp of a valid subscription token for `channel` (None: none), or the NACK."""
        if not isinstance(token, str) or not token:
            return 403, "a subscription token is needed for this channel"
        try:
            claims = await self.owner.verify(token, self.conn.request)
        except AuthError as exc:
            return 403, f"invalid subscription token: {exc}"
        if claims.get("channel") != channel:
            return 403, "the subscription token is for another channel"
        identity = self.conn.identity
        if _subject(claims) != _subject(identity.claims if identity is not None else None):
            return 403, "the subscription token names another subject"
        exp = claims.get("exp")
        if isinstance(exp, int | float) and not isinstance(exp, bool):
            if exp <= time.time():
                return 403, "subscription token expired"
            return float(exp)
        return None

    def subscribed(self, msg: Any) -> None:
        """The SUB went through: time its token."""
        if self._admitted and msg.uuid in self._admitted:
            self.sub_renewed((bool(msg.pattern), msg.channel), self._admitted.pop(msg.uuid))

    def unsubscribed(self, channel: str, pattern: bool) -> None:
        self.core.sub_ended((bool(pattern), channel))
        self._arm()

    def private_subscription(self, key: SubKey) -> bool:
        return self.core.timed(key)

    def renewed(self, exp: float | None) -> None:
        self.core.renewed(exp, time.time())
        self._arm()

    def sub_renewed(self, key: SubKey, exp: float | None) -> None:
        self.core.sub_renewed(key, exp, time.time())
        self._arm()

    def stop(self) -> None:
        """The connection is gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks or ():
            task.cancel()

    # the timer --------------------------------------------------------------------------

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.conn.closed:
            return
        when = self.core.next_deadline()
        if when is not None:
            self._timer = self.conn.loop.call_later(max(0.0, when - time.time()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        conn = self.conn
        if conn.closed:
            return
        for due in self.core.tick(time.time()):
            if due.what == CLOSE:
                log.info("connection %s: token expired; closing", conn.remote)
                conn.session.set_reason(CLOSE_REASON)
                conn.close(CLOSE_CODE, CLOSE_TEXT)
                return
            if due.what == WARN:
                self._warn(due.expires_in, due.sub)
            elif due.what == REFRESH_HOOK:
                self._spawn(self._ask_refresher(due.expires_in))
            elif due.what == END_SUB:
                assert due.sub is not None
                self._spawn(self._end_sub(due.sub))
        self._arm()

    def _warn(self, expires_in: float, sub: SubKey | None) -> None:
        if self.messages:
            msg_uuid = rustext.new_uuid()
            self.conn.send(EXPIRING, msg_uuid, expiring_frame(msg_uuid, expires_in, sub))

    def _spawn(self, coro: Any) -> None:
        task = self.conn.loop.create_task(coro)
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask_refresher(self, expires_in: float) -> None:
        conn = self.conn
        refresher = self.owner.refresher
        assert refresher is not None
        identity = conn.identity
        try:
            async with asyncio.timeout(max(0.1, min(self.owner.refresh_timeout, expires_in + self.owner.rules.grace))):
                outcome = await refresher.refresh(conn, identity)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("connection %s: the refresher failed; warning the client instead", conn.remote,
                        exc_info=True)
            if not conn.closed:
                self._warn(max(0.0, (self.core.exp or time.time()) - time.time()), None)
            return
        if conn.closed:
            return
        if outcome.refused:
            log.info("connection %s: the refresher refused to renew; closing", conn.remote)
            conn.session.set_reason(CLOSE_REASON)
            conn.close(CLOSE_CODE, CLOSE_TEXT)
            return
        self.info = outcome.info
        if identity is not None:
            identity.exp = outcome.expire_at
        self.renewed(outcome.expire_at)

    async def _end_sub(self, sub: SubKey) -> None:
        conn = self.conn
        log.info("connection %s: subscription token for %s expired; unsubscribing", conn.remote, sub[1])
        try:
            await conn.drop_subscription(sub[1], sub[0])
        except Exception:
            log.warning("connection %s: ending the subscription to %s failed", conn.remote, sub[1], exc_info=True)
        if self.messages and not conn.closed:
            msg_uuid = rustext.new_uuid()
            conn.send(EXPIRING, msg_uuid, expiring_notice(msg_uuid, sub))
