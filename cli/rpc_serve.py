"""``juggler rpc serve``: run an RPC server (an app ``module:object`` or an example).

Wired by ``cli/rpc.py`` (``rpc_serve.register(rpc_subparsers)``); also runs
alone: ``python -m cli.rpc_serve --example arith --gateway 127.0.0.1:8080``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

EPILOG = """examples:
  juggler rpc serve --listen 127.0.0.1:8972 --example bench          # rpcx-benchmark's Hello.Say
  juggler rpc serve --listen 127.0.0.1:8972 --example arith --gateway 127.0.0.1:8080
  juggler rpc serve --listen 0.0.0.0:8972 --app myapp.services:Arith \\
      --redis redis://127.0.0.1:6379/0 --advertise tcp@10.0.0.5:8972 --metrics-port 9100
  juggler rpc serve --listen unix@/tmp/arith.sock --example arith --idle-timeout 90
  curl -s http://127.0.0.1:8080/Arith -H 'X-RPCX-ServiceMethod: Mul' -H 'X-RPCX-SerializeType: 1' -d '{"A":6,"B":7}'
  curl -s http://127.0.0.1:8972/Arith -H 'X-RPCX-ServiceMethod: Mul' -H 'X-RPCX-SerializeType: 1' -d '{"A":6,"B":7}'
      # the same HTTP API answered on the rpcx port (unless --no-http)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="rpcx protocol listener: HOST:PORT, tcp@HOST:PORT or unix@/path "
                        "(HTTP gateway requests on the same port are answered too)")
    p.add_argument("--no-http", action="store_true", help="do not answer HTTP on the --listen port")
    p.add_argument("--max-message", type=int, default=64 << 20, metavar="BYTES",
                   help="largest rpcx message and largest inflated gzip payload accepted (default 64 MiB)")
    p.add_argument("--max-connections", type=int, default=10_000, help="rpcx connections at once (default 10000)")
    p.add_argument("--idle-timeout", type=float, metavar="S",
                   help="close rpcx connections silent that long (no request, no heartbeat; default never)")
    p.add_argument("--gateway", metavar="HOST:PORT", help="HTTP gateway (X-RPCX-* and JSON-RPC 2.0) on its own port")
    p.add_argument("--grpc", metavar="HOST:PORT",
                   help="also serve the benchmark's Hello.Say over grpc.aio (the reference peer of `rpc bench`)")
    app = p.add_mutually_exclusive_group(required=True)
    app.add_argument("--app", metavar="MODULE:OBJECT", help="service object/class, dict, or f(server)")
    app.add_argument("--example", choices=("bench", "arith"), help="bench: Hello.Say (protobuf); arith: Arith.Mul/Add (JSON)")
    p.add_argument("--metadata", default="", metavar="QUERY", help="service metadata published to registries, e.g. weight=2")
    p.add_argument("--auth", action="append", metavar="TOKEN", help="accepted __AUTH token (repeatable)")
    p.add_argument("--rate-limit", type=float, metavar="REQ_PER_S", help="server-wide request rate limit")
    p.add_argument("--conn-rate-limit", type=float, metavar="CONN_PER_S", help="accepted connections per second")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST", help="interface of /metrics (default 0.0.0.0)")
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    reg = p.add_mutually_exclusive_group()
    reg.add_argument("--redis", metavar="URL", help="register in this Redis registry")
    reg.add_argument("--etcd", metavar="URL", help="register in this etcd (http://host:2379)")
    p.add_argument("--base", default="/rpcx", help="registry base path (default /rpcx)")
    p.add_argument("--advertise", metavar="tcp@HOST:PORT", help="address published to the registry (default: --listen)")
    p.add_argument("--ttl", type=float, default=10.0, help="registry TTL in seconds (default 10)")
    p.add_argument("--handler-timeout", type=float, metavar="S", help="deadline for requests without __ServerTimeout")
    p.add_argument("--max-sync-workers", type=int, default=32, help="thread pool of sync handlers (default 32)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, help="drain deadline at shutdown (default 10 s)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="run an RPC server", description=__doc__.splitlines()[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def _hostport(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"{flag} must be HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


async def _start_rpcx_listener(
    server: Any, address: str, *, http: bool = True, config: Any = None, idle_timeout: float | None = None
) -> Any:
    """Start the rpcx listener (``rpc.rpcx_server.RpcxServer``) on ``address``
    (``HOST:PORT``, ``tcp@HOST:PORT`` or ``unix@/path``); with ``http`` the
    HTTP gateway answers on the same port (first byte not rpcx's 0x08)."""
    from rpc.gateway import Gateway
    from rpc.rpcx_server import RpcxServer

    rpcx = RpcxServer(server, address, gateway=Gateway(server.dispatcher) if http else None, config=config,
                      idle_timeout=idle_timeout)
    await rpcx.start()
    return rpcx


async def serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from rpc.examples import register_example
    from rpc.plugins import AccessLogPlugin, AuthPlugin, ConnRateLimitPlugin, MetricsPlugin, ReqRateLimitPlugin
    from rpc.server import Server, load_app

    log = logging.getLogger("rpc.serve")
    if not args.listen and not args.gateway and not args.grpc:
        print("error: give --listen, --gateway and/or --grpc", file=sys.stderr)
        return 2
    plugins: list[object] = []
    metrics = None
    if args.conn_rate_limit:
        plugins.append(ConnRateLimitPlugin(args.conn_rate_limit))
    if args.rate_limit:
        plugins.append(ReqRateLimitPlugin(args.rate_limit))
    if args.auth:
        plugins.append(AuthPlugin(args.auth))
    if args.metrics_port is not None:
        metrics = MetricsPlugin()
        plugins.append(metrics)
    if args.access_log:
        plugins.append(AccessLogPlugin())
    registrars: list[Any] = []
    if args.redis:
        from rpc.discovery.redis import RedisRegistrar

        registrars.append(RedisRegistrar(args.redis, base=args.base, ttl=args.ttl))
    elif args.etcd:
        from rpc.discovery.etcd import EtcdRegistrar

        registrars.append(EtcdRegistrar(args.etcd, base=args.base, ttl=max(2, round(args.ttl))))
    server = Server(plugins=plugins, registrars=registrars, max_sync_workers=args.max_sync_workers,
                    handler_timeout=args.handler_timeout)
    if args.example:
        register_example(server.registry, args.example)
    else:
        load_app(args.app, server)
    if args.metadata:
        for service in server.registry.services.values():
            service.metadata = args.metadata

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    listener = None
    gateway = None
    grpc_server = None
    metrics_httpd = None
    try:
        if args.listen:
            from rpc.transport.config import ConnectionConfig, ServerConfig

            try:
                config = ServerConfig(
                    connection=ConnectionConfig(max_frame=args.max_message, max_decompressed=args.max_message),
                    max_connections=args.max_connections,
                )
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            if args.idle_timeout is not None and args.idle_timeout <= 0:
                print("error: --idle-timeout must be > 0", file=sys.stderr)
                return 2
            listener = await _start_rpcx_listener(server, args.listen, http=not args.no_http, config=config,
                                                  idle_timeout=args.idle_timeout)
            args.listen = listener.address.partition("@")[2]  # the bound port when 0 was asked
        if args.gateway:
            from rpc.gateway import Gateway, GatewayServer

            host, port = _hostport(args.gateway, "--gateway")
            gateway = GatewayServer(Gateway(server.dispatcher), host, port)
            await gateway.start()
        if args.grpc:
            from rpc.grpc_peer import start_grpc_server

            host, port = _hostport(args.grpc, "--grpc")
            grpc_server, port = await start_grpc_server(host, port)
            args.grpc = f"{host}:{port}"
        if metrics is not None:
            from prometheus_client import start_http_server

            metrics_httpd, _ = start_http_server(args.metrics_port, addr=args.metrics_host, registry=metrics.registry)
        advertise = args.advertise or (listener.address if listener is not None else None)
        if registrars and advertise:
            await server.publish(advertise)
        where = ", ".join(
            x for x in (
                f"rpcx on {listener.address}" if listener is not None else "",
                f"http gateway on {gateway.host}:{gateway.port}" if gateway else "",
                f"grpc.aio Hello.Say on {args.grpc}" if grpc_server is not None else "",
                f"metrics on :{args.metrics_port}" if metrics is not None else "",
            ) if x
        )
        services = ", ".join(sorted(server.registry.services))
        log.info("rpc serve: %s; services %s", where, services)
        print(f"rpc serve: {where}; services {services}", flush=True)
        await stop.wait()
        print("rpc serve: shutting down", flush=True)
    finally:
        class _Both:
            async def stop_accepting(self) -> None:
                if listener is not None:
                    await listener.stop_accepting()

            async def close_connections(self) -> None:
                if listener is not None:
                    await listener.close_connections()
                if gateway is not None:
                    await gateway.aclose(drain_timeout=1.0)

        drained = await server.shutdown(_Both(), timeout=args.shutdown_timeout)
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)
        if metrics_httpd is not None:
            metrics_httpd.shutdown()
            metrics_httpd.server_close()
    return 0 if drained else 1


def run(args: argparse.Namespace) -> int:
    import logging

    import uvloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return uvloop.run(serve(args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="juggler rpc serve", description=__doc__.splitlines()[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
