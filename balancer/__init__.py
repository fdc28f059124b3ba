"""balancer: the control plane of the HTTP load balancer.

The data plane (forwarding, pools, algorithms, stats) is ``rustext.Balancer``
on threads of its own; this package configures and watches it.

- config    typed config dataclasses and the TOML loader (validation)
- discovery DNS service discovery: backends by name (A/AAAA) or SRV, re-resolved
- health    active HTTP health checks (asyncio, aiohttp) marking backends up/down
- service   ``LoadBalancer``: data plane + health checks, reload, drain
- auth      the admin endpoint's authentication: Basic (bcrypt users) and bearer tokens
- admin     the admin HTTP endpoint (aiohttp) on top of a service: backends,
            drain, weights, reload, metrics
- metrics   the data plane's stats as a prometheus-client collector
- runner    ``BalancerProcess``: a service and its admin endpoint, as ``juggler balancer`` runs them
- config_errors  where a config error is: the key at fault and its line (FILE:LINE:)
- errors    ``BalancerError`` / ``BalancerConfigError``
"""

from balancer.config import BackendConfig, BalancerConfig, HealthCheck, Limits, Passive, Timeouts, load
from balancer.errors import BalancerConfigError, BalancerError
from balancer.service import LoadBalancer

__all__ = [
    "BackendConfig",
    "BalancerConfig",
    "BalancerConfigError",
    "BalancerError",
    "HealthCheck",
    "Limits",
    "LoadBalancer",
    "Passive",
    "Timeouts",
    "load",
]
