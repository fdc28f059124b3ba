"""Access log settings: where the lines go (a file, standard output or a
syslog server) and in which format. The lines themselves are formatted and
written by the data plane (``rustext/src/balancer/accesslog.rs``); this
module validates the ``[access_log]`` table (and a listener's own
``access_log``), which the data plane reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from balancer.errors import BalancerConfigError

__all__ = ["FACILITIES", "AccessLog"]

#: syslog facilities by name (RFC 5424 §6.2.1)
FACILITIES = {
    "kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7, "uucp": 8,
    "cron": 9, "authpriv": 10, "ftp": 11, "ntp": 12, "audit": 13, "alert": 14, "cron2": 15,
    **{f"local{i}": 16 + i for i in range(8)},
}


def _syslog_address(value: str, where: str) -> str:
    """``udp://host:port``, ``host:port`` (UDP), ``tcp://host:port``, ``unix:/dev/log`` or
    ``/dev/log`` → the data plane's form."""
    from balancer.checks import parse_hostport

    if value.startswith(("unix:", "/")):
        path = value.removeprefix("unix:")
        if not path.startswith("/"):
            raise BalancerConfigError(f"{where}.syslog: a socket path must be absolute, got {value!r}")
        return f"unix:{path}"
    scheme, sep, hostport = value.partition("://")
    if not sep:
        scheme, hostport = "udp", value
    if scheme not in ("udp", "tcp") or "://" in hostport:
        raise BalancerConfigError(
            f"{where}.syslog must be udp://host:port (or host:port), tcp://host:port or unix:/path "
            f"(a datagram socket), got {value!r}")
    parse_hostport(hostport, f"{where}.syslog")
    return f"{scheme}://{hostport}"


@dataclass(frozen=True, kw_only=True)
class AccessLog:
    """One line per request (the ``[access_log]`` table, or a listener's
    ``access_log``), written by a thread of its own: lines the writer cannot
    keep up with are dropped and counted (``balancer_access_log_dropped_total``),
    never waited for."""

    #: a file, appended to (reopened on SIGHUP, for logrotate), or ``"-"``: standard output
    path: str = ""
    #: ``haproxy`` (HAProxy's httplog line), ``combined`` (nginx's), ``json`` (one object per line),
    #: or a format of ``%`` variables (see the manual's "Access logs"); changed on reload
    format: str = "haproxy"
    #: instead of ``path``: a syslog server, ``udp://host:port`` (or ``host:port``),
    #: ``tcp://host:port`` (RFC 6587 octet-counted frames), or a local datagram socket
    #: ``unix:/dev/log``; one message per line
    syslog: str | None = None
    #: the syslog facility: ``local0`` … ``local7``, ``daemon``, ``user``, …
    facility: str = "local0"
    #: ``rfc3164`` (BSD syslog, what HAProxy sends by default) or ``rfc5424``
    syslog_format: str = "rfc3164"
    #: over TCP: ``octet-count`` (RFC 6587 ``LEN SP MSG`` frames, the default) or ``newline``
    #: (each message ends with a newline, for receivers that read lines; HAProxy's ``log-proto legacy``)
    syslog_framing: str | None = None
    #: the syslog tag (APP-NAME in RFC 5424)
    tag: str = "balancer"
    #: syslog messages longer than this are cut (HAProxy's ``len``)
    max_length: int = 1024
    #: also log connections closed before sending a byte (HAProxy without ``option dontlognull``)
    log_empty: bool = False
    where: str = field(default="access_log", repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        w = self.where
        if not isinstance(self.format, str):
            raise BalancerConfigError(f"{w}.format must be a string")
        import rustext

        try:
            rustext.Balancer.check_log_format(self.format)
        except ValueError as exc:
            raise BalancerConfigError(f"{w}.format: {exc}") from None
        if not isinstance(self.log_empty, bool):
            raise BalancerConfigError(f"{w}.log_empty must be true or false")
        if self.syslog is not None:
            if self.path:
                raise BalancerConfigError(f"{w}: give path or syslog, not both")
            if not isinstance(self.syslog, str) or not self.syslog:
                raise BalancerConfigError(f"{w}.syslog must be an address such as \"udp://127.0.0.1:514\"")
            object.__setattr__(self, "syslog", _syslog_address(self.syslog, w))
            if self.facility not in FACILITIES:
                raise BalancerConfigError(
                    f"{w}.facility must be one of {', '.join(FACILITIES)}; got {self.facility!r}")
            if self.syslog_format not in ("rfc3164", "rfc5424"):
                raise BalancerConfigError(f"{w}.syslog_format must be rfc3164 or rfc5424, got {self.syslog_format!r}")
            if self.syslog_framing is not None:
                if self.syslog_framing not in ("octet-count", "newline"):
                    raise BalancerConfigError(
                        f"{w}.syslog_framing must be octet-count or newline, got {self.syslog_framing!r}")
                if not self.syslog.startswith("tcp://"):
                    raise BalancerConfigError(f"{w}.syslog_framing applies to a tcp:// syslog server only")
            if not isinstance(self.tag, str) or not self.tag or len(self.tag) > 48 or not all(
                    33 <= ord(c) < 127 for c in self.tag):
                raise BalancerConfigError(f"{w}.tag must be 1 to 48 visible ASCII characters, got {self.tag!r}")
            if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or not (
                    64 <= self.max_length <= 65000):
                raise BalancerConfigError(f"{w}.max_length must be an integer in 64..65000, got {self.max_length!r}")
            return
        if not isinstance(self.path, str) or not self.path:
            raise BalancerConfigError(f"{w}.path must be a file name or \"-\" (or give syslog = \"udp://host:port\")")
        if self.path != "-":
            parent = os.path.dirname(os.path.abspath(self.path))
            if os.path.isdir(self.path):
                raise BalancerConfigError(f"{w}.path {self.path} is a directory")
            if os.path.exists(self.path):
                if not os.access(self.path, os.W_OK):
                    raise BalancerConfigError(f"{w}.path {self.path} is not writable")
            elif not os.path.isdir(parent):
                raise BalancerConfigError(f"{w}.path {self.path}: no such directory {parent}")
            elif not os.access(parent, os.W_OK | os.X_OK):
                raise BalancerConfigError(f"{w}.path {self.path}: cannot create a file in {parent}")

    @property
    def destination(self) -> str:
        """Where the lines go (a reload may change it)."""
        return f"syslog {self.syslog}" if self.syslog is not None else self.path

    @property
    def facility_code(self) -> int | None:
        """The number of ``facility`` (RFC 5424 §6.2.1) that syslog messages carry; None without ``syslog``."""
        return FACILITIES[self.facility] if self.syslog is not None else None
