"""Service discovery: which servers serve a service.

- ``base``   Discovery (client side, with subscriptions), StaticDiscovery
             (one peer or a fixed list), Registrar (server side),
             WatchingDiscovery (fetch + watch + periodic refresh + cache)
- ``cache``  FileCache: the file-cached fallback when a registry is unreachable
- ``redis``  RedisRegistrar / RedisDiscovery (TTL + heartbeat, pub/sub watch)
- ``etcd``   EtcdRegistrar / EtcdDiscovery (etcd v3 over its JSON gateway)
- ``url``    RegistryURL (``etcd://host:2379/rpcx``, ``redis://…``) and RegistryRoute
             (an XClient through it: selector, fail mode, group), as the CLI takes them
"""

from rpc.discovery.base import Discovery, Registrar, StaticDiscovery, WatchingDiscovery
from rpc.discovery.cache import FileCache

__all__ = ["Discovery", "FileCache", "Registrar", "StaticDiscovery", "WatchingDiscovery"]
