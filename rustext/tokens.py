"""Bearer tokens (JWT) verified with PyJWT, shared by juggler's handshake
authentication and rpc's ``__AUTH`` plugin.

Keys come from a shared secret (HS256/384/512), a PEM public key file, and/or
a JWKS URL (RS256/384/512, PS256/384/512, ES256/384/512, EdDSA, and HS* for
``oct`` keys): what an identity provider (Auth0, Keycloak, Okta, Cognito)
publishes.

- **The key fixes the algorithm.** A token's ``alg`` must belong to its key's
  family (an RSA key verifies RS*/PS* only, a P-256 key ES256 only, a secret
  HS* only; a JWK's own ``alg`` narrows it to that one). ``none`` is never
  accepted, and an HS* token is never checked against a public key.
- **JWKS** is fetched at :meth:`TokenVerifier.start`, refreshed every
  ``jwks_refresh`` seconds in the background (retrying with the suite's
  backoff when the provider is down: the keys held stay in use), and again
  when a token names a ``kid`` not held yet (key rotation), at most once
  every ``jwks_min_interval`` seconds. Such a token gets
  :class:`UnknownKey` from :meth:`TokenVerifier.verify`, whose
  :meth:`~TokenVerifier.verify_fresh` awaits the refetch: every other token
  is verified synchronously, with no I/O.
- ``exp`` and ``nbf`` are checked (with ``leeway``), ``aud`` and ``iss`` when
  configured.

The HTTP client is aiohttp (the suite's control-plane HTTP library).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.exceptions import PyJWTError

from rustext.backoff import Backoff, BackoffPolicy

__all__ = ["TokenConfig", "TokenError", "TokenVerifier", "UnknownKey"]

log = logging.getLogger("rustext.tokens")

HMAC = ("HS256", "HS384", "HS512")
RSA = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
#: every algorithm a token may use, with the right key
ALGORITHMS = (*HMAC, *RSA, *_CURVES.values(), "EdDSA")


class TokenError(ValueError):
    """A token that does not verify; the message says why, for a log line or
    an HTTP 401 reason."""


class UnknownKey(TokenError):
    """The token names a key (``kid``) the JWKS does not hold (yet); see
    :meth:`TokenVerifier.verify_fresh`."""


@dataclass(frozen=True, kw_only=True)
class TokenConfig:
    """Where keys come from and what a token must say."""

    #: shared secret of HS256/384/512 tokens
    secret: str = ""
    #: PEM file of a public key (RSA, EC or Ed25519)
    public_key: str = ""
    #: URL of a JSON Web Key Set (e.g. ``https://idp.example.com/.well-known/jwks.json``)
    jwks_url: str = ""
    #: seconds between background refreshes of the JWKS
    jwks_refresh: float = 300.0
    #: fewest seconds between two fetches of the JWKS caused by unknown key ids
    jwks_min_interval: float = 10.0
    #: seconds to fetch the JWKS
    jwks_timeout: float = 5.0
    #: the ``aud`` claim must contain this (when set)
    audience: str = ""
    #: the ``iss`` claim must be this (when set)
    issuer: str = ""
    #: seconds of clock skew allowed on ``exp`` and ``nbf``
    leeway: float = 0.0

    def __post_init__(self) -> None:
        if self.leeway < 0:
            raise ValueError("leeway must be >= 0")
        if self.jwks_refresh <= 0 or self.jwks_min_interval < 0 or self.jwks_timeout <= 0:
            raise ValueError("jwks_refresh and jwks_timeout must be > 0, jwks_min_interval >= 0")
        if self.jwks_url and not self.jwks_url.startswith(("https://", "http://")):
            raise ValueError(f"jwks_url must be an http(s) URL, got {self.jwks_url!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.public_key or self.jwks_url)


def _family(key: Any) -> tuple[str, ...]:
    """The algorithms a public key object verifies."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if isinstance(key, rsa.RSAPublicKey):
        return RSA
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}.get(key.curve.name)
        return (alg,) if alg else ()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return ("EdDSA",)
    return ()


def _jwk_family(data: Mapping[str, Any]) -> tuple[str, ...]:
    kty = data.get("kty")
    if kty == "RSA":
        family: tuple[str, ...] = RSA
    elif kty == "EC":
        family = (_CURVES[data["crv"]],) if data.get("crv") in _CURVES else ()
    elif kty == "OKP":
        family = ("EdDSA",) if data.get("crv") == "Ed25519" else ()
    elif kty == "oct":
        family = HMAC
    else:
        family = ()
    alg = data.get("alg")
    if alg:
        return (alg,) if alg in family else ()
    return family


@dataclass(frozen=True)
class _Jwk:
    data: Mapping[str, Any]
    family: tuple[str, ...]


class TokenVerifier:
    """Verifies tokens against the configured keys (see the module doc).

    Lifecycle: ``await start()`` (loads the PEM key, fetches the JWKS, starts
    its refresh), then :meth:`verify`; ``await aclose()`` stops the refresh.
    Without a JWKS URL, :meth:`start` is optional. Lives on one event loop.
    """

    def __init__(self, config: TokenConfig) -> None:
        if not config.enabled:
            raise ValueError("no token key configured: set a secret, a public key file or a JWKS URL")
        self.config = config
        self._public: tuple[Any, tuple[str, ...]] | None = None
        if config.public_key:
            self._public = self._load_public_key(config.public_key)
        self._jwks: dict[str, _Jwk] = {}  # kid -> key
        self._anonymous_jwks: list[_Jwk] = []  # keys without a kid
        self._keys: dict[tuple[str, str], Any] = {}  # (kid, alg) -> key object
        self._fetched_at = -1e9
        self._fetching: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._session: Any = None
        #: JWKS fetches done, and failed (metrics)
        self.jwks_fetches = 0
        self.jwks_failures = 0

    @staticmethod
    def _load_public_key(path: str) -> tuple[Any, tuple[str, ...]]:
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        try:
            with open(path, "rb") as f:
                key = load_pem_public_key(f.read())
        except OSError as exc:
            raise ValueError(f"public key {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"public key {path}: not a PEM public key ({exc})") from None
        family = _family(key)
        if not family:
            raise ValueError(f"public key {path}: unsupported key type (RSA, EC P-256/384/521 or Ed25519)")
        return key, family

    # lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Fetch the JWKS (a failure is logged and retried in the background:
        tokens signed by its keys are refused meanwhile) and start refreshing it."""
        if not self.config.jwks_url or self._refresher is not None:
            return
        try:
            await self._fetch()
        except TokenError as exc:
            log.warning("%s; retrying in the background", exc)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def aclose(self) -> None:
        """Stop refreshing; idempotent."""
        for task in (self._refresher, self._fetching):
            if task is not None:
                task.cancel()
        for task in (self._refresher, self._fetching):
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._refresher = self._fetching = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> TokenVerifier:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # verification ---------------------------------------------------------------

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims; :class:`TokenError` when it does not verify,
        :class:`UnknownKey` when it names a key the JWKS may gain on a refetch."""
        try:
            header = jwt.get_unverified_header(token)
        except PyJWTError:
            raise TokenError("malformed token") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise TokenError(f"token algorithm {alg!r} not accepted")
        key = self._key_for(alg, header.get("kid"))
        cfg = self.config
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=cfg.audience or None,
                issuer=cfg.issuer or None,
                leeway=cfg.leeway,
                options={"verify_aud": bool(cfg.audience), "verify_iss": bool(cfg.issuer)},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("token expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenError("token not valid yet") from None
        except jwt.InvalidAudienceError:
            raise TokenError("token audience mismatch") from None
        except jwt.InvalidIssuerError:
            raise TokenError("token issuer mismatch") from None
        except jwt.InvalidSignatureError:
            raise TokenError("bad token signature") from None
        except PyJWTError as exc:
            raise TokenError(f"invalid token: {exc}") from None

    async def verify_fresh(self, token: str) -> dict[str, Any]:
        """:meth:`verify`, after refetching the JWKS when the token names an
        unknown key and the last fetch is old enough (rate-limited; concurrent
        callers share one fetch)."""
        try:
            return self.verify(token)
        except UnknownKey:
            if not self.refetch_allowed():
                raise
        await self._refetch()
        return self.verify(token)

    def refetch_allowed(self) -> bool:
        """Whether an unknown key id may cause a JWKS fetch now."""
        cfg = self.config
        return bool(cfg.jwks_url) and time.monotonic() - self._fetched_at >= cfg.jwks_min_interval

    def _key_for(self, alg: str, kid: Any) -> Any:
        if kid is not None and self.config.jwks_url:
            jwk = self._jwks.get(str(kid))
            if jwk is None:
                raise UnknownKey(f"token signed by an unknown key (kid {kid!r})")
            return self._key_object(str(kid), jwk, alg)
        if alg in HMAC and self.config.secret:
            return self.config.secret.encode()
        if self._public is not None and alg in self._public[1]:
            return self._public[0]
        usable = [j for j in self._anonymous_jwks if alg in j.family]
        if kid is None and len(usable) == 1:
            return self._key_object("", usable[0], alg)
        raise TokenError(f"no key verifies {alg} tokens" + (f" (kid {kid!r})" if kid is not None else ""))

    def _key_object(self, kid: str, jwk: _Jwk, alg: str) -> Any:
        if alg not in jwk.family:
            raise TokenError(f"token algorithm {alg} does not match its key (kid {kid!r})")
        cached = self._keys.get((kid, alg))
        if cached is None:
            try:
                cached = jwt.PyJWK(dict(jwk.data), algorithm=alg).key
            except PyJWTError as exc:
                raise TokenError(f"unusable key (kid {kid!r}): {exc}") from None
            self._keys[(kid, alg)] = cached
        return cached

    # the JWKS -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Fetch the JWKS now (joining a fetch already under way); raises
        :class:`TokenError` when it fails (the keys held stay in use)."""
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.get_running_loop().create_task(self._fetch())
        await asyncio.shield(self._fetching)

    async def _refetch(self) -> None:
        try:
            await self.refresh()
        except TokenError as exc:
            log.warning("%s", exc)

    async def _refresh_loop(self) -> None:
        backoff = Backoff(BackoffPolicy(initial=1.0, maximum=min(60.0, self.config.jwks_refresh)))
        delay = self.config.jwks_refresh
        while True:
            await asyncio.sleep(delay)
            try:
                await self.refresh()
            except TokenError as exc:
                delay = backoff.next_delay()
                log.warning("%s; keeping the keys held, retrying in %.1f s", exc, delay)
            else:
                backoff.reset()
                delay = self.config.jwks_refresh

    async def _fetch(self) -> None:
        import aiohttp

        url = self.config.jwks_url
        self._fetched_at = time.monotonic()
        self.jwks_fetches += 1
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.jwks_timeout))
        try:
            async with self._session.get(url, headers={"Accept": "application/json"}) as resp:
                if resp.status != 200:
                    raise TokenError(f"cannot fetch the JWKS at {url}: HTTP {resp.status}")
                body = await resp.read()
            doc = json.loads(body)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.jwks_failures += 1
            raise TokenError(f"cannot fetch the JWKS at {url}: {exc or type(exc).__name__}") from None
        except TokenError:
            self.jwks_failures += 1
            raise
        keys = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(keys, list):
            self.jwks_failures += 1
            raise TokenError(f"the JWKS at {url} has no 'keys' list")
        by_kid: dict[str, _Jwk] = {}
        anonymous: list[_Jwk] = []
        for data in keys:
            if not isinstance(data, dict) or data.get("use", "sig") != "sig":
                continue
            family = _jwk_family(data)
            if not family:
                continue  # a key type or algorithm we do not verify with
            jwk = _Jwk(data=data, family=family)
            if "kid" in data:
                by_kid[str(data["kid"])] = jwk
            else:
                anonymous.append(jwk)
        self._jwks, self._anonymous_jwks = by_kid, anonymous
        self._keys = {}
        log.debug("JWKS from %s: %d keys", url, len(by_kid) + len(anonymous))
