"""rpc: an rpcx-compatible RPC framework with service governance.

Layout (one module per concept):

- ``errors``     the exception tree (RpcError, ServiceError never retried, TransportError, ...)
- ``message``    the rpcx message model (types, flags, seq, path/method, metadata, payload)
- ``service``    registered services, Context, ServiceDispatcher (message → response), ServerSession
- ``server``     Server: services + plugins + registry publication + graceful shutdown order
- ``plugins/``   hook container, auth, connection/request rate limits, Prometheus metrics, access log
- ``selector``   random, round robin, smooth weighted RR, latency, consistent hash, user-defined
- ``failmode``   failfast / failover / failtry / failbackup with retries
- ``breaker``    per-server circuit breaker (consecutive failures or failure rate, half-open probe)
- ``client``     Client: calls to one server over a ServerCaller
- ``xclient``    XClient: discovery + selector + fail mode + breakers over a ServerCaller
- ``client_plugins``  client hooks: before/after each call, connection opened/closed
- ``tracing``    OpenTelemetry server and client plugins, context in the rpcx metadata as
                 rpcx-plugins carries it (the otel extra; imported only when tracing)
- ``inprocess``  an in-process ServerCaller (XClient straight onto local dispatchers)
- ``gateway``    HTTP gateway (rpcx X-RPCX-* API, JSON-RPC 2.0), its HTTP/1.1 parser and server
- ``gateway_client``  HTTPCaller: a ServerCaller over the HTTP gateway
- ``grpc_peer``  grpc.aio Hello.Say server and GrpcCaller (the benchmark's reference)
- ``rpcx_server`` RpcxServer: the services over rpc.transport (rpcx wire, HTTP sniffed on the same port)
- ``rpcx_client`` RpcxCaller: the ServerCaller of the rpcx protocol (pool, heartbeats, server push)
- ``callers``    which ServerCaller serves an address (http://, grpc://, inproc:, rpcx)
- ``sidechannel``  rpcx's token-guarded side listener and raw byte connections (shared below)
- ``filetransfer``   rpcx file transfer: _filetransfer TransferFile/DownloadFile, send_file/download_file
- ``streams``    rpcx streams: _streamservice Stream, open_stream
- ``bench``      the benchmark client's engine (load, percentiles, processes, report)
- ``discovery/`` static, Redis and etcd registries, file-cached fallback
- ``examples``   Hello.Say (rpcx benchmark, protobuf) and Arith.Mul/Add (JSON)
- ``proto/``     generated protobuf messages of the examples
- ``transport/`` the multiplexed network transport (TCP, unix, in-process channels, pool)
                 and the payload codecs (``transport/codec``: raw, JSON, protobuf, msgpack)
"""
