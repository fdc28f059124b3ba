"""rpc: an rpcx-compatible RPC framework with service governance.

Layout (one module per concept):

- ``errors``     the exception tree (RpcError, ServiceError never retried, TransportError, ...)
- ``message``    the rpcx message model (types, flags, seq, path/method, metadata, payload)
- ``codec``      payload codecs by serialize type: raw, JSON, protobuf (by annotation), msgpack
- ``service``    registered services, Context, ServiceDispatcher (message → response), ServerSession
- ``server``     Server: services + plugins + registry publication + graceful shutdown order
- ``plugins/``   hook container, auth, connection/request rate limits, Prometheus metrics, access log
- ``selector``   random, round robin, smooth weighted RR, latency, consistent hash, user-defined
- ``failmode``   failfast / failover / failtry / failbackup with retries
- ``breaker``    per-server circuit breaker (consecutive failures or failure rate, half-open probe)
- ``xclient``    XClient: discovery + selector + fail mode + breakers over a ServerCaller
- ``inprocess``  an in-process ServerCaller (XClient straight onto local dispatchers)
- ``discovery/`` static, Redis and etcd registries, file-cached fallback
- ``examples``   Hello.Say (rpcx benchmark, protobuf) and Arith.Mul/Add (JSON)
- ``proto/``     generated protobuf messages of the examples
- ``transport/`` the multiplexed network transport (TCP, unix, in-process channels, pool)
"""
