"""Authentication of the admin endpoint (the ``[admin_auth]`` table).

Two schemes, either or both, as HAProxy's ``userlist`` / ``stats auth``:

- HTTP Basic against users with bcrypt password hashes (``name:$2b$…``
  lines, as ``htpasswd -nB name`` prints them; inline or in a file);
- a bearer token read from a file or an environment variable.

:class:`Authenticator` is sans-I/O apart from bcrypt's CPU time (the
caller runs :meth:`Authenticator.check` in a thread): it takes the value of
the ``Authorization`` header and says yes or no. Every path through it
costs the same whatever is wrong (unknown user: a bcrypt check against a
dummy hash; tokens compared as SHA-256 digests with
``hmac.compare_digest``), so timing tells an attacker nothing. Headers over
:data:`MAX_HEADER` are refused before anything is decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
from dataclasses import dataclass

import bcrypt

from balancer.errors import BalancerConfigError

__all__ = ["MAX_HEADER", "READ_ONLY", "AdminAuth", "Authenticator"]

log = logging.getLogger("balancer.admin")

#: the longest ``Authorization`` header looked at (longer: refused unread)
MAX_HEADER = 4096
#: the admin endpoint's read-only paths, the only ones that may be public
READ_ONLY = ("/metrics", "/healthz", "/backends", "/stats", "/config")
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


def _parse_users(lines: list[str], where: str) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, hashed = line.partition(":")
        h = hashed.strip().encode()
        if not sep or not name or not h.startswith(_BCRYPT_PREFIXES) or len(h) != 60:
            raise BalancerConfigError(
                f"{where} (entry {n}) must be \"name:bcrypt-hash\" as `htpasswd -nB name` prints it")
        if name in users:
            raise BalancerConfigError(f"{where}: user {name!r} is listed twice")
        users[name] = h
    return users


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise BalancerConfigError(f"{what} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise BalancerConfigError(f"{what} {path}: not UTF-8 text") from exc


@dataclass(frozen=True, kw_only=True)
class AdminAuth:
    """Credentials asked of admin requests (the ``[admin_auth]`` table); any one that matches lets a request in."""

    #: users for HTTP Basic: ``"name:HASH"`` with a bcrypt hash (``htpasswd -nB name``)
    users: tuple[str, ...] = ()
    #: a file of such lines (``htpasswd -cB FILE name``), read at start and on reload
    users_file: str | None = None
    #: a file whose content (stripped) is the bearer token, read at start and on reload
    token_file: str | None = None
    #: an environment variable holding the bearer token
    token_env: str | None = None
    #: read-only paths answered without credentials, e.g. ``["/metrics", "/healthz"]``
    public: tuple[str, ...] = ()
    #: the realm named in ``WWW-Authenticate``
    realm: str = "juggler balancer"

    def __post_init__(self) -> None:
        object.__setattr__(self, "users", tuple(self.users))
        object.__setattr__(self, "public", tuple(self.public))
        if not (self.users or self.users_file or self.token_file or self.token_env):
            raise BalancerConfigError("admin_auth needs users, users_file, token_file or token_env")
        for p in self.public:
            if p not in READ_ONLY:
                raise BalancerConfigError(
                    f"admin_auth.public: {p!r} is not one of the read-only paths {', '.join(READ_ONLY)}")
        if '"' in self.realm or "\\" in self.realm or not self.realm.isprintable():
            raise BalancerConfigError("admin_auth.realm must be printable, without quotes or backslashes")
        self.load()  # files and variables are checked now: a mistake is a config error, not a lockout

    def load(self) -> tuple[dict[str, bytes], bytes | None]:
        """(users → bcrypt hash, SHA-256 of the token or None), read now."""
        users = _parse_users(list(self.users), "admin_auth.users")
        if self.users_file:
            for name, h in _parse_users(_read(self.users_file, "admin_auth.users_file").splitlines(),
                                        f"admin_auth.users_file {self.users_file}").items():
                if name in users:
                    raise BalancerConfigError(f"admin_auth: user {name!r} is listed twice")
                users[name] = h
        token = None
        if self.token_file:
            token = _read(self.token_file, "admin_auth.token_file").strip()
            if len(token) < 16:
                raise BalancerConfigError(f"admin_auth.token_file {self.token_file}: the token must have 16 "
                                          "characters or more")
        if self.token_env:
            value = os.environ.get(self.token_env, "").strip()
            if len(value) < 16:
                raise BalancerConfigError(f"admin_auth.token_env: ${self.token_env} must hold a token of 16 "
                                          "characters or more")
            if token is not None and value != token:
                raise BalancerConfigError("admin_auth: token_file and token_env hold different tokens; give one")
            token = value
        return users, (hashlib.sha256(token.encode()).digest() if token is not None else None)


class Authenticator:
    """Checks ``Authorization`` headers against one :class:`AdminAuth`, loaded once."""

    def __init__(self, config: AdminAuth) -> None:
        self.config = config
        self._users, self._token = config.load()
        # checked when the user is unknown, at the cost of the users' hashes: an unknown user takes as long
        rounds = max((int(h[4:6]) for h in self._users.values()), default=4)
        self._dummy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=min(max(rounds, 4), 31)))

    @property
    def challenges(self) -> list[str]:
        """The ``WWW-Authenticate`` values of a 401."""
        out = []
        if self._users:
            out.append(f'Basic realm="{self.config.realm}", charset="UTF-8"')
        if self._token is not None:
            out.append(f'Bearer realm="{self.config.realm}"')
        return out

    def is_public(self, path: str) -> bool:
        return path in self.config.public

    def check(self, header: str | None) -> bool:
        """True if ``header`` (the ``Authorization`` value) carries valid
        credentials. Blocking (bcrypt): run it in a thread."""
        if header is None or len(header) > MAX_HEADER:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        if scheme == "bearer" and self._token is not None:
            given = hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).digest()
            return hmac.compare_digest(given, self._token)
        if scheme == "basic" and self._users:
            try:
                decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                return False
            name, sep, password = decoded.partition(":")
            hashed = self._users.get(name)
            try:
                ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self._dummy)
            except ValueError:  # longer than bcrypt's 72 bytes, or a NUL: no such password can match
                return False
            return bool(sep) and hashed is not None and ok
        return False
