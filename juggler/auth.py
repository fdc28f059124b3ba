"""Authentication at the handshake and authorization per message.

Authentication (at the websocket handshake, :meth:`Auth.authenticate`):
the credential is a bearer token taken from a header (``Authorization:
Bearer <token>`` by default) or a query parameter (``?token=...``). It is
verified by a configurable function ``verify(token, request) -> claims``
(``verifier = "module:function"``, may be ``async``-free only: it runs on
the handshake path and must be fast), or by the built-in JWT HS256 check
(:func:`jwt_decode_hs256`, secret from config; ``exp``/``nbf`` honoured,
``aud``/``iss`` checked when configured). A missing or invalid credential
refuses the handshake with HTTP 401, unless ``anonymous = true`` (then the
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

import base64
import hashlib
import hmac
import importlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from juggler.broker.glob import glob_match
from juggler.errors import JugglerError

__all__ = [
    "Auth",
    "AuthConfig",
    "AuthError",
    "Identity",
    "Rule",
    "jwt_decode_hs256",
    "jwt_encode_hs256",
]

KINDS = ("call", "pub", "sub")


class AuthError(JugglerError):
    """Authentication failed; `status` is the HTTP status of the refusal (401/403)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def jwt_encode_hs256(claims: Mapping[str, Any], secret: str | bytes) -> str:
    """A compact HS256 JWT of `claims` (for tests and token tools)."""
    key = secret.encode() if isinstance(secret, str) else secret
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(dict(claims), separators=(",", ":")).encode())
    signing = f"{header}.{body}".encode()
    return f"{header}.{body}.{_b64url(hmac.new(key, signing, hashlib.sha256).digest())}"


def jwt_decode_hs256(
    token: str,
    secret: str | bytes,
    *,
    leeway: float = 0.0,
    audience: str | None = None,
    issuer: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Verify an HS256 JWT and return its claims; :class:`AuthError` if invalid.

    Only ``alg: HS256`` is accepted (never ``none``); the signature is
    compared in constant time; ``exp`` and ``nbf`` are checked (with
    `leeway` s); ``aud``/``iss`` when given.
    """
    key = secret.encode() if isinstance(secret, str) else secret
    parts = token.split(".")
    if len(parts) != 3:
        raise AuthError("malformed token")
    try:
        header = json.loads(_b64url_decode(parts[0]))
        claims = json.loads(_b64url_decode(parts[1]))
        sig = _b64url_decode(parts[2])
    except (ValueError, UnicodeDecodeError):
        raise AuthError("malformed token") from None
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        raise AuthError("unsupported token algorithm")
    if not isinstance(claims, dict):
        raise AuthError("malformed token claims")
    expected = hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(sig, expected):
        raise AuthError("bad token signature")
    t = time.time() if now is None else now
    exp = claims.get("exp")
    if exp is not None:
        if not isinstance(exp, int | float) or t > exp + leeway:
            raise AuthError("token expired")
    nbf = claims.get("nbf")
    if nbf is not None:
        if not isinstance(nbf, int | float) or t + leeway < nbf:
            raise AuthError("token not valid yet")
    if audience is not None:
        aud = claims.get("aud")
        auds = aud if isinstance(aud, list) else [aud]
        if audience not in auds:
            raise AuthError("token audience mismatch")
    if issuer is not None and claims.get("iss") != issuer:
        raise AuthError("token issuer mismatch")
    return claims


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

    #: HS256 secret of the built-in JWT verification
    jwt_secret: str = ""
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        rules = tuple(r if isinstance(r, Rule) else _rule(r) for r in self.rules)
        object.__setattr__(self, "rules", rules)
        if self.leeway < 0:
            raise ValueError("leeway must be >= 0")
        if self.verifier and ":" not in self.verifier:
            raise ValueError("verifier must be 'module:function'")

    @property
    def enabled(self) -> bool:
        return bool(self.jwt_secret or self.verifier)

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

    __slots__ = ("claims", "exp", "grants", "name")

    def __init__(self, claims: Mapping[str, Any] | None, grants: dict[str, tuple[str, ...]] | None) -> None:
        self.claims = dict(claims) if claims is not None else None
        self.grants = grants  # None = everything
        exp = self.claims.get("exp") if self.claims else None
        self.exp = float(exp) if isinstance(exp, int | float) else None
        self.name = str(self.claims.get("sub", "?")) if self.claims is not None else "anonymous"

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


def _load_verifier(spec: str) -> Callable[[str, Any], Any]:
    mod, _, name = spec.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"verifier {spec} is not callable")
    return obj  # type: ignore[no-any-return]


class Auth:
    """The handshake hook and the per-message check of one server (see module doc)."""

    def __init__(self, config: AuthConfig, verifier: Callable[[str, Any], Any] | None = None) -> None:
        self.config = config
        self.verifier = verifier or (_load_verifier(config.verifier) if config.verifier else None)
        self.enabled = config.enabled or verifier is not None

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

    def authenticate(self, request: Any) -> Identity:
        """The handshake hook: the connection's identity, or AuthError (401/403)."""
        self.check_origin(request)
        if not self.enabled:
            return Identity({}, self._grants({}))
        token = self.token(request)
        if token is None:
            if self.config.anonymous:
                return Identity(None, None)
            raise AuthError("missing token")
        cfg = self.config
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
            claims = jwt_decode_hs256(
                token, cfg.jwt_secret, leeway=cfg.leeway, audience=cfg.audience or None, issuer=cfg.issuer or None
            )
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
