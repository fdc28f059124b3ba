"""balancer: the control plane of the HTTP load balancer.

The data plane (forwarding, pools, algorithms, stats) is ``rustext.Balancer``
on threads of its own; this package configures and watches it.

- config    typed config dataclasses and the TOML loader (validation)
- health    active HTTP health checks (asyncio) marking backends up/down
- admin     the admin HTTP endpoint: backends, drain, weights, reload, metrics
- metrics   Prometheus text rendering of the data plane's stats
- service   ``LoadBalancer``: lifecycle, SIGHUP reload, drain
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
