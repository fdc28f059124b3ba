"""balancer: the control plane of the HTTP load balancer.

The data plane (forwarding, pools, algorithms, stats) is ``rustext.Balancer``
on threads of its own; this package configures and watches it.

- config    typed config dataclasses and the TOML loader (validation); the one definition of the
            configuration, which the data plane reads directly
- config_sections  the tables that validate on their own: ``[timeouts]``, ``[passive]``, ``[limits]``,
            ``[health]``, ``[tls]`` (re-exported by config)
- routing   typed routing config: named pools, listeners, routes, header rules,
            redirects, request ids (compiled by the data plane's route table)
- rewrite   typed route rewrites (path and query) and the check of route regular expressions
- ratelimit typed ``[rate_limit]``: requests per client address or header (counted by the data plane)
- policies  typed pool policies: cookie persistence (``sticky``), backups, slow start, ``retry_on``,
            layer-7 passive health
- discovery DNS service discovery: backends by name (A/AAAA) or SRV, re-resolved
- health    active health checks (asyncio): HTTP/1 (aiohttp), HTTP/2 and gRPC (h2) marking backends up/down
- service   ``LoadBalancer``: data plane + health checks, reload, drain
- auth      the admin endpoint's authentication: Basic (bcrypt users) and bearer tokens
- admin     the admin HTTP endpoint (aiohttp) on top of a service: backends,
            drain, weights, reload, metrics
- metrics   the data plane's stats as a prometheus-client collector
- handover  binary upgrade: the handover socket that gives the listening sockets to a new process
- runner    ``BalancerProcess``: a service, its admin endpoint and handover socket, as ``juggler balancer``
            runs them
- config_errors  where a config error is: the key at fault and its line (FILE:LINE:)
- errors    ``BalancerError`` / ``BalancerConfigError``
"""

from balancer.config import (
    BackendConfig,
    BalancerConfig,
    load,
)
from balancer.config_sections import (
    HealthCheck,
    Limits,
    Passive,
    Timeouts,
)
from balancer.errors import BalancerConfigError, BalancerError
from balancer.routing import (
    HeaderMatch,
    HeaderRules,
    Hsts,
    Listener,
    NamedBackend,
    Redirect,
    RequestId,
    Route,
)
from balancer.service import LoadBalancer

__all__ = [
    "BackendConfig",
    "BalancerConfig",
    "BalancerConfigError",
    "BalancerError",
    "HeaderMatch",
    "HeaderRules",
    "HealthCheck",
    "Hsts",
    "Limits",
    "Listener",
    "LoadBalancer",
    "NamedBackend",
    "Passive",
    "Redirect",
    "RequestId",
    "Route",
    "Timeouts",
    "load",
]
