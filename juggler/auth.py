"""Authentication at the handshake and authorization per message.

Authentication (at the websocket handshake, :meth:`Auth.authenticate`):
the credential is a bearer token taken from a header (``Authorization:
Bearer <token>`` by default) or a query parameter (``?token=...``). It is
verified by a configurable function ``verify(token, request) -> claims``
(``verifier = "module:function"``, may be ``async``-free only: it runs on
the handshake path and must be fast), or as a JWT by
:class:`rustext.tokens.TokenVerifier` (PyJWT): a shared secret (HS256/384/512),
a PEM public key, or a JWKS URL (RS*, PS*, ES*, EdDSA), the algorithm fixed
by the key; ``exp``/``nbf`` honoured, ``aud``/``iss`` checked when
configured. A token naming a key the JWKS does not hold yet waits for one
(rate-limited) refetch; every other handshake is checked without I/O. A
missing or invalid credential refuses the handshake with HTTP 401, unless
``anonymous = true`` (then the
connection is anonymous and every message that needs an identity gets
NACK 401). The ``Origin`` header is checked against ``allowed_origins``
(glob patterns; empty = any origin): others get HTTP 403.

Authorization (per CALL/PUB/SUB, :meth:`Identity.allowed`): each identity has
the URI/channel glob patterns it may ``call``, ``pub`` and ``sub`` — from
the claim ``juggler`` of its token (``{"call": [...], "pub": [...], "sub":
[...]}``) and/or from the config's ``[[auth.rules]]`` (a rule applies when
each of its ``match`` claims matches, as a glob). No rule and no claim:
an authenticated identity may do everything. Refusals are NACK 403 (NACK
401 for an anonymous connection, or once the token has expired).
Patterns follow Redis glob rules (``juggler.broker.glob``); a pattern
subscription is checked as a string against the ``sub`` patterns.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rustext.tokens import TokenConfig, TokenError, TokenVerifier, UnknownKey

from juggler.broker.glob import glob_match
from juggler.errors import JugglerError

__all__ = [
    "Auth",
    "AuthConfig",
    "AuthError",
    "Identity",
    "Rule",
    "user_of",
]

KINDS = ("call", "pub", "sub")


class AuthError(JugglerError):
    """Authentication failed; `status` is the HTTP status of the refusal (401/403)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """Grants patterns to the identities whose claims match ``match`` (claim → glob)."""

    #: claim → glob; all must match (a list claim matches if one of its elements does); empty: everyone
    match: Mapping[str, str] = field(default_factory=dict)
    #: URI globs the identity may CALL
    call: tuple[str, ...] = ()
    #: channel globs the identity may PUB to
    pub: tuple[str, ...] = ()
    #: channel globs the identity may SUB to (a pattern subscription is checked as a string)
    sub: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for k in KINDS:
            object.__setattr__(self, k, tuple(getattr(self, k)))
        object.__setattr__(self, "match", dict(self.match))

    def applies(self, claims: Mapping[str, Any]) -> bool:
        for claim, pattern in self.match.items():
            v = claims.get(claim)
            if v is None:
                return False
            values = v if isinstance(v, list) else [v]
            if not any(glob_match(pattern, str(x)) for x in values):
                return False
        return True


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthConfig:
    """``[auth]`` options; ``enabled`` when a secret or a verifier is set."""

    #: shared secret of HS256/384/512 tokens
    jwt_secret: str = ""
    #: PEM public key file verifying RS*/PS*/ES*/EdDSA tokens
    jwt_public_key: str = ""
    #: JSON Web Key Set URL of an identity provider (fetched at start, refreshed in the background)
    jwks_url: str = ""
    #: seconds between background refreshes of the JWKS (a token with an unknown kid also triggers one)
    jwks_refresh: float = 300.0
    #: fewest seconds between two JWKS fetches caused by tokens naming unknown key ids
    jwks_min_interval: float = 10.0
    #: "module:function" called as f(token, request) -> claims dict (raise or return None to refuse)
    verifier: str = ""
    #: header carrying the token ("Bearer " prefix optional)
    header: str = "Authorization"
    #: query parameter carrying the token (browsers cannot set headers on websockets)
    query_param: str = "token"
    #: let connections without a token in (anonymous: NACK 401 where an identity is needed)
    anonymous: bool = False
    #: the JWT ``aud`` claim must contain this (checked when set)
    audience: str = ""
    #: the JWT ``iss`` claim must be this (checked when set)
    issuer: str = ""
    #: seconds of clock skew allowed on ``exp`` and ``nbf``
    leeway: float = 0.0
    #: Origin header allow-list (globs, e.g. "https://*.example.com"); empty = any
    allowed_origins: tuple[str, ...] = ()
    #: refuse handshakes without an Origin header when allowed_origins is set
    require_origin: bool = False
    #: per-identity grants (see Rule)
    rules: tuple[Rule, ...] = ()
    #: seconds before a token's exp that its connection is warned (EXPIRING) or the refresher
    #: asked; at most half of what is left of the token's life (juggler.refresh)
    refresh_warning: float = 30.0
    #: seconds after a token's exp that a REFRESH (or SUB_REFRESH) is still waited for
    expiry_grace: float = 0.0
    #: close a connection whose token expired (code 4001); off: it stays, its messages get NACK 401
    close_expired: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        rules = tuple(r if isinstance(r, Rule) else _rule(r) for r in self.rules)
        object.__setattr__(self, "rules", rules)
        if self.leeway < 0:
            raise ValueError("leeway must be >= 0")
        if self.refresh_warning < 0 or self.expiry_grace < 0:
            raise ValueError("refresh_warning and expiry_grace must be >= 0")
        if self.verifier and ":" not in self.verifier:
            raise ValueError("verifier must be 'module:function'")
        self.tokens()  # validates the JWT options

    def tokens(self) -> TokenConfig:
        """The JWT verification options."""
        return TokenConfig(
            secret=self.jwt_secret, public_key=self.jwt_public_key, jwks_url=self.jwks_url,
            jwks_refresh=self.jwks_refresh, jwks_min_interval=self.jwks_min_interval, audience=self.audience, issuer=self.issuer, leeway=self.leeway,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.verifier) or self.tokens().enabled

    @property
    def active(self) -> bool:
        """Anything to check at all (authentication, origins or rules)."""
        return self.enabled or bool(self.allowed_origins) or bool(self.rules)


def _rule(data: Any) -> Rule:
    if not isinstance(data, Mapping):
        raise ValueError("[[auth.rules]] entries must be tables")
    unknown = set(data) - {"match", "call", "pub", "sub"}
    if unknown:
        raise ValueError(f"unknown option(s) in [[auth.rules]]: {', '.join(sorted(unknown))}")
    return Rule(**data)


class Identity:
    """Who a connection is, and what it may do (checked per message)."""

    __slots__ = ("channels", "claims", "data", "exp", "grants", "name", "user")

    def __init__(self, claims: Mapping[str, Any] | None, grants: dict[str, tuple[str, ...]] | None, *,
                 user: str | None = None, data: Any = None, channels: tuple[str, ...] = ()) -> None:
        self.claims = dict(claims) if claims is not None else None
        self.grants = grants  # None = everything
        exp = self.claims.get("exp") if self.claims else None
        self.exp = float(exp) if isinstance(exp, int | float) else None
        self.name = str(self.claims.get("sub", "?")) if self.claims is not None else "anonymous"
        #: the user as the application's connect proxy named it (None: no connect proxy)
        self.user = user
        #: what the connect proxy said about the connection (any JSON value)
        self.data = data
        #: channels the server subscribes this connection to (juggler.serversubs): those the
        #: connect proxy named, else the token's ``channels`` claim
        self.channels: tuple[str, ...] = tuple(channels) if channels else _channels_claim(self.claims)

    @property
    def anonymous(self) -> bool:
        return self.claims is None

    def check(self, kind: str, target: str) -> tuple[int, str] | None:
        """None if allowed, else (NACK code, message)."""
        if self.claims is None:
            return 401, "unauthorized"
        if self.exp is not None and time.time() > self.exp:
            return 401, "token expired"
        if self.grants is None:
            return None
        for pattern in self.grants.get(kind, ()):
            if glob_match(pattern, target):
                return None
        return 403, "forbidden"


def _channels_claim(claims: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ``channels`` claim (a list of channel names) as a tuple; AuthError
    (the handshake is refused) when it is there and not such a list."""
    value = claims.get("channels") if claims else None
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(c, str) and c for c in value):
        raise AuthError("invalid channels claim: expected a list of non-empty channel names")
    return tuple(dict.fromkeys(value))


def _load_verifier(spec: str) -> Callable[[str, Any], Any]:
    from rustext.appspec import import_object

    obj = import_object(spec, what="verifier")
    if not callable(obj):
        raise ValueError(f"verifier {spec} is not callable")
    return obj  # type: ignore[no-any-return]


class Auth:
    """The handshake hook and the per-message check of one server (see module doc).

    Lifecycle: ``await start()`` (fetches a JWKS when one is configured)
    before the server accepts connections, ``await aclose()`` after.
    """

    def __init__(self, config: AuthConfig, verifier: Callable[[str, Any], Any] | None = None) -> None:
        self.config = config
        self.verifier = verifier or (_load_verifier(config.verifier) if config.verifier else None)
        self.enabled = config.enabled or verifier is not None
        tokens = config.tokens()
        self.tokens = TokenVerifier(tokens) if self.verifier is None and tokens.enabled else None

    async def start(self) -> None:
        if self.tokens is not None:
            await self.tokens.start()

    async def aclose(self) -> None:
        if self.tokens is not None:
            await self.tokens.aclose()

    def check_origin(self, request: Any) -> None:
        allowed = self.config.allowed_origins
        if not allowed:
            return
        origin = request.headers.get("Origin")
        if origin is None:
            if self.config.require_origin:
                raise AuthError("missing Origin", 403)
            return
        if not any(glob_match(p, origin) for p in allowed):
            raise AuthError(f"origin {origin} not allowed", 403)

    def token(self, request: Any) -> str | None:
        cfg = self.config
        if cfg.header:
            value = request.headers.get(cfg.header)
            if value:
                if value[:7].lower() == "bearer ":
                    value = value[7:]
                return value.strip() or None
        if cfg.query_param:
            query = urlsplit(request.path).query
            if query:
                values = parse_qs(query).get(cfg.query_param)
                if values:
                    return values[0]
        return None

    def authenticate(self, request: Any) -> Identity | Awaitable[Identity]:
        """The handshake hook: the connection's identity, or AuthError
        (401/403). An awaitable of it when the token names a JWKS key not
        held yet and a refetch is allowed (the caller waits for it)."""
        self.check_origin(request)
        if not self.enabled:
            return Identity({}, self._grants({}))
        token = self.token(request)
        if token is None:
            if self.config.anonymous:
                return Identity(None, None)
            raise AuthError("missing token")
        if self.verifier is not None:
            try:
                claims = self.verifier(token, request)
            except AuthError:
                raise
            except Exception as exc:
                raise AuthError(f"token refused: {exc}") from None
            if claims is None or claims is False:
                raise AuthError("token refused")
            if claims is True:
                claims = {}
            if not isinstance(claims, Mapping):
                raise AuthError("verifier returned no claims")
        else:
            assert self.tokens is not None
            try:
                claims = self.tokens.verify(token)
            except UnknownKey as exc:
                if not self.tokens.refetch_allowed():
                    raise AuthError(str(exc)) from None
                return self._authenticate_fresh(token)
            except TokenError as exc:
                raise AuthError(str(exc)) from None
        return Identity(claims, self._grants(claims))

    async def _authenticate_fresh(self, token: str) -> Identity:
        assert self.tokens is not None
        try:
            claims = await self.tokens.verify_fresh(token)
        except TokenError as exc:
            raise AuthError(str(exc)) from None
        return Identity(claims, self._grants(claims))

    def _grants(self, claims: Mapping[str, Any]) -> dict[str, tuple[str, ...]] | None:
        grants: dict[str, list[str]] = {}
        any_grant = False
        own = claims.get("juggler")
        if isinstance(own, Mapping):
            any_grant = True
            for k in KINDS:
                v = own.get(k, ())
                grants.setdefault(k, []).extend(str(x) for x in (v if isinstance(v, list) else [v]))
        if self.config.rules:
            any_grant = True
            for rule in self.config.rules:
                if rule.applies(claims):
                    for k in KINDS:
                        grants.setdefault(k, []).extend(getattr(rule, k))
        if not any_grant:
            return None
        return {k: tuple(grants.get(k, ())) for k in KINDS}


def user_of(conn: Any) -> str | None:
    """The user of a connection: its identity's name (none without auth, nor for an anonymous one)."""
    identity = conn.identity
    if identity is None or getattr(identity, "anonymous", False):
        return None
    return str(identity.name)
