"""Service discovery: which servers serve a service.

- ``base``   Discovery (client side, with subscriptions), StaticDiscovery
             (one peer or a fixed list), Registrar (server side),
             WatchingDiscovery (fetch + watch + periodic refresh + cache)
- ``cache``  FileCache: the file-cached fallback when a registry is unreachable
- ``redis``  RedisRegistrar / RedisDiscovery (TTL + heartbeat, keyspace-notification
             watch; Go rpcx's libkv layout, or the earlier one with layout="juggler")
- ``libkv``  the keys and values of that layout, sans I/O (libkv v0.5.1's Redis store)
- ``etcd``   EtcdRegistrar / EtcdDiscovery (etcd v3 over its JSON gateway)
- ``zookeeper`` ZooKeeperRegistrar / ZooKeeperDiscovery (ephemeral nodes, children
             watch; Go rpcx-zookeeper's layout, over kazoo)
- ``consul`` ConsulRegistrar / ConsulDiscovery (KV entries held by sessions, blocking-query
             watch; Go rpcx-consul's layout, over Consul's HTTP API)
- ``dns``    DnsDiscovery: the servers a DNS name resolves to (A/AAAA, or SRV with ports
             and weights), refreshed on the records' TTL; nothing registers
- ``url``    RegistryURL (``etcd://host:2379/rpcx``, ``redis://…``) and RegistryRoute
             (an XClient through it: selector, fail mode, group), as the CLI takes them
"""

from rpc.discovery.base import Discovery, Registrar, StaticDiscovery, WatchingDiscovery
from rpc.discovery.cache import FileCache

__all__ = ["Discovery", "FileCache", "Registrar", "StaticDiscovery", "WatchingDiscovery"]
