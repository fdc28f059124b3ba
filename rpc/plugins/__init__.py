"""Server plugins (hooks at every step of serving; see ``container``).

- ``container``  PluginContainer: the hooks and how they run
- ``auth``       AuthPlugin: ``__AUTH`` tokens or a check function; JwtAuthPlugin: JWTs
- ``ratelimit``  TokenBucket, ConnRateLimitPlugin, ReqRateLimitPlugin
- ``metrics``    MetricsPlugin: Prometheus requests/errors/latency/in-flight
- ``accesslog``  AccessLogPlugin: one log line per request
"""

from rpc.plugins.accesslog import AccessLogPlugin
from rpc.plugins.auth import AuthPlugin, JwtAuthPlugin
from rpc.plugins.container import HOOKS, PluginContainer
from rpc.plugins.metrics import MetricsPlugin
from rpc.plugins.ratelimit import ConnRateLimitPlugin, ReqRateLimitPlugin, TokenBucket

__all__ = [
    "HOOKS",
    "AccessLogPlugin",
    "AuthPlugin",
    "JwtAuthPlugin",
    "ConnRateLimitPlugin",
    "MetricsPlugin",
    "PluginContainer",
    "ReqRateLimitPlugin",
    "TokenBucket",
]
