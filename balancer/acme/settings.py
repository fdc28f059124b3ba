"""The ``[acme]`` table: which names get certificates from which CA, where
they are kept and how they are renewed."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from balancer.errors import BalancerConfigError

#: Let's Encrypt's production directory (trusted certificates, strict rate limits)
LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
#: Let's Encrypt's staging directory (untrusted certificates, generous limits: for trying things out)
LETS_ENCRYPT_STAGING = "https://acme-staging-v02.api.letsencrypt.org/directory"

CHALLENGES = ("http-01", "tls-alpn-01")

_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_FRACTION = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_span(value: object, where: str) -> float:
    """Seconds from a number or ``"90s"``, ``"30m"``, ``"12h"``, ``"30d"``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BalancerConfigError(f"{where}: expected a duration such as \"12h\" or \"30d\", got {value!r}")
    if isinstance(value, str):
        m = _SPAN.match(value)
        if not m:
            raise BalancerConfigError(f"{where}: expected a duration such as \"12h\" or \"30d\", got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        seconds = float(value)
    if not seconds > 0:
        raise BalancerConfigError(f"{where}: expected a positive duration, got {value!r}")
    return seconds


@dataclass(frozen=True, kw_only=True)
class Acme:
    """Certificates for ``names`` from an ACME CA, obtained at start and
    renewed ahead of expiry by the balancer itself (the ``[acme]`` table);
    the listener serves HTTPS with them (no ``[[tls.certificates]]`` needed)."""

    #: the host names of the certificate (one certificate lists them all; the first is its subject)
    names: tuple[str, ...] = ()
    #: the folder keeping the account key, the certificate and its key (created 0700, files 0600);
    #: balancer processes sharing it order one at a time and pick up each other's certificates
    storage: str = ""
    #: the CA's directory URL; Let's Encrypt's staging directory is
    #: ``https://acme-staging-v02.api.letsencrypt.org/directory``
    directory: str = LETS_ENCRYPT
    #: the contact address given to the CA (expiry notices); unset = none
    email: str | None = None
    #: the challenges the balancer answers, in preference order: ``"http-01"`` (a plain-HTTP listener
    #: or ``tls.redirect`` must be reachable on port 80) and ``"tls-alpn-01"`` (the HTTPS listener on 443)
    challenges: tuple[str, ...] = CHALLENGES
    #: a PEM file of CA certificates trusted for the directory's HTTPS (a private CA); unset = the system's
    ca_root: str | None = None
    #: when to renew: a fraction of the certificate's lifetime left (``"1/3"``) or a duration before
    #: expiry (``"30d"``, ``"12h"``)
    renew_before: str = "1/3"
    #: the first wait after a failed order (``"1m"``, seconds); it doubles, with jitter, up to a day
    retry_after: str | float = "1m"
    #: how often a process that is not ordering looks for a certificate another one stored
    watch_interval: str | float = "10s"

    def __post_init__(self) -> None:
        names = self.names
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
            raise BalancerConfigError("acme.names: expected an array of host names, such as [\"example.com\"]")
        normal = []
        for n in names:
            host = n.strip().rstrip(".").lower() if isinstance(n, str) else ""
            if not _NAME.match(host):
                raise BalancerConfigError(f"acme.names: {n!r} is not a host name (wildcards need DNS-01, "
                                          f"which the balancer does not answer)")
            if host not in normal:
                normal.append(host)
        object.__setattr__(self, "names", tuple(normal))
        if not isinstance(self.storage, str) or not self.storage.strip():
            raise BalancerConfigError("acme.storage: give the folder keeping the account and certificates")
        if not isinstance(self.directory, str) or not self.directory.startswith(("https://", "http://")):
            raise BalancerConfigError(f"acme.directory: expected the CA's directory URL, got {self.directory!r}")
        if self.email is not None and (not isinstance(self.email, str) or "@" not in self.email):
            raise BalancerConfigError(f"acme.email: expected an e-mail address, got {self.email!r}")
        chal = self.challenges
        if isinstance(chal, str) or not isinstance(chal, (list, tuple)) or not chal:
            raise BalancerConfigError("acme.challenges: expected an array of \"http-01\", \"tls-alpn-01\"")
        for c in chal:
            if c not in CHALLENGES:
                raise BalancerConfigError(f"acme.challenges: expected \"http-01\" or \"tls-alpn-01\", got {c!r}")
        object.__setattr__(self, "challenges", tuple(dict.fromkeys(chal)))
        if self.ca_root is not None and not os.path.isfile(self.ca_root):
            raise BalancerConfigError(f"acme.ca_root: {self.ca_root}: no such file")
        self.renewal()
        parse_span(self.retry_after, "acme.retry_after")
        parse_span(self.watch_interval, "acme.watch_interval")

    def renewal(self) -> tuple[str, float]:
        """``("fraction", f)`` or ``("before", seconds)`` from ``renew_before``."""
        value = self.renew_before
        if isinstance(value, str) and (m := _FRACTION.match(value)):
            num, den = int(m.group(1)), int(m.group(2))
            if not 0 < num < den:
                raise BalancerConfigError(f"acme.renew_before: a fraction between 0 and 1, got {value!r}")
            return "fraction", num / den
        return "before", parse_span(value, "acme.renew_before")

    @property
    def retry_seconds(self) -> float:
        return parse_span(self.retry_after, "acme.retry_after")

    @property
    def watch_seconds(self) -> float:
        return parse_span(self.watch_interval, "acme.watch_interval")


