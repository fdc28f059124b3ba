"""``juggler rpc serve``: run an RPC server (an app ``module:object`` or an example).

Wired by ``cli/rpc.py`` (``rpc_serve.register(rpc_subparsers)``); also runs
alone: ``python -m cli.rpc_serve --example arith --gateway 127.0.0.1:8080``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from cli.kcp import add_kcp_arguments, kcp_options, uses_kcp
from cli.otel import add_otel_argument
from cli.tls import add_server_tls_arguments, server_tls

DESCRIPTION = ("Run an RPC server speaking rpcx (and its HTTP API on the same port): your app "
               "(--app module:object) or a built-in example (--example arith|bench).")

EPILOG = """examples:
  juggler rpc serve --listen 127.0.0.1:8972 --example bench          # rpcx-benchmark's Hello.Say
  juggler rpc serve --listen 127.0.0.1:8972 --example arith --gateway 127.0.0.1:8080
  juggler rpc serve --listen 0.0.0.0:8972 --app myapp.services:Arith \\
      --redis redis://127.0.0.1:6379/0 --advertise tcp@10.0.0.5:8972 --metrics-port 9100
  juggler rpc serve --listen 0.0.0.0:8973 --example arith --etcd http://127.0.0.1:2379 \\
      --advertise tcp@10.0.0.6:8973 --metadata weight=2 --group canary   # published as weight=2&group=canary
  juggler rpc serve --listen 0.0.0.0:8974 --example arith --zookeeper 127.0.0.1:2181 --base /rpcx \\
      --advertise tcp@10.0.0.7:8974   # an ephemeral node /rpcx/Arith/tcp@10.0.0.7:8974, as Go's rpcx-zookeeper
  juggler rpc serve --listen 0.0.0.0:8975 --example arith --consul 127.0.0.1:8500 --base /rpcx \\
      --advertise tcp@10.0.0.8:8975   # the key rpcx/Arith/tcp@10.0.0.8:8975 held by a session, as Go's rpcx-consul
  juggler rpc serve --listen unix@/tmp/arith.sock --example arith --idle-timeout 90
  curl -s http://127.0.0.1:8080/Arith -H 'X-RPCX-ServiceMethod: Mul' -H 'X-RPCX-SerializeType: 1' -d '{"A":6,"B":7}'
  curl -s http://127.0.0.1:8972/Arith -H 'X-RPCX-ServiceMethod: Mul' -H 'X-RPCX-SerializeType: 1' -d '{"A":6,"B":7}'
      # the same HTTP API answered on the rpcx port (unless --no-http)
  juggler rpc serve --listen 127.0.0.1:8972 --example arith --tls-cert certs/cert.pem --tls-key certs/key.pem
  juggler rpc call 127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --tls-ca certs/ca.pem
  juggler rpc serve --listen quic@127.0.0.1:8972 --example arith --tls-cert certs/cert.pem --tls-key certs/key.pem
  juggler rpc call quic@127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --tls-ca certs/ca.pem   # rpcx over QUIC
  juggler rpc serve --listen kcp@127.0.0.1:8972 --example arith --kcp-key rpcx-key
  juggler rpc call kcp@127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --kcp-key rpcx-key   # rpcx over KCP (Go: -tags kcp)
  juggler rpc serve --listen 0.0.0.0:8972 --example arith --file-transfer /srv/files --file-transfer-listen 0.0.0.0:8973
      # rpcx's _filetransfer service (Go: XClient.SendFile / DownloadFile), files kept in /srv/files
      # rpcx over TLS (and https:// on the same port); certificates: juggler tls dev-cert --out certs
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="rpcx protocol listener: HOST:PORT, tcp@HOST:PORT, quic@HOST:PORT (needs --tls-cert), "
                        "kcp@HOST:PORT (needs --kcp-key) or unix@/path (HTTP gateway requests on a TCP port are answered too)")
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
    p.add_argument("--group", metavar="NAME",
                   help="publish group=NAME with every service: XClients of that group use this server")
    p.add_argument("--auth", action="append", metavar="TOKEN", help="accepted __AUTH token (repeatable)")
    p.add_argument("--jwks-url", metavar="URL", help="accept __AUTH JWTs signed by a key of this JSON Web Key Set")
    p.add_argument("--jwt-public-key", metavar="FILE", help="accept __AUTH JWTs signed by this PEM public key")
    p.add_argument("--jwt-secret", metavar="SECRET", help="accept __AUTH JWTs (HS256/384/512) with this secret")
    p.add_argument("--jwt-audience", metavar="AUD", help="JWTs must name this audience (aud)")
    p.add_argument("--jwt-issuer", metavar="ISS", help="JWTs must come from this issuer (iss)")
    p.add_argument("--rate-limit", type=float, metavar="REQ_PER_S", help="server-wide request rate limit")
    p.add_argument("--conn-rate-limit", type=float, metavar="CONN_PER_S", help="accepted connections per second")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="interface of /metrics (default 127.0.0.1, as every metrics endpoint of the suite; 0.0.0.0 for all)")
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    add_otel_argument(p)
    add_kcp_arguments(p)
    reg = p.add_mutually_exclusive_group()
    reg.add_argument("--redis", metavar="URL",
                     help="register in this Redis registry (Go rpcx's key layout: its clients find this server)")
    reg.add_argument("--etcd", metavar="URL", help="register in this etcd (http://host:2379)")
    reg.add_argument("--zookeeper", metavar="HOST:PORT",
                     help="register in this ZooKeeper (HOST:PORT[,HOST:PORT…]; rpcx-zookeeper's layout, "
                          "ephemeral nodes: --ttl is the session timeout)")
    reg.add_argument("--consul", metavar="HOST:PORT",
                     help="register in this Consul agent's KV store (HOST:8500; rpcx-consul's layout; "
                          "a --ttl under 20 s is raised to 20, as Consul's sessions last at least 10 s)")
    p.add_argument("--base", default="/rpcx", help="registry base path (default /rpcx)")
    p.add_argument("--redis-layout", choices=("libkv", "juggler"), default="libkv",
                   help="--redis key layout: libkv, Go rpcx's (default); juggler, the one clients of the "
                        "previous release read")
    p.add_argument("--advertise", metavar="tcp@HOST:PORT", help="address published to the registry (default: --listen)")
    p.add_argument("--ttl", type=float, default=10.0, help="registry TTL in seconds (default 10)")
    p.add_argument("--registry-tls-ca", metavar="FILE",
                   help="rediss:// or https:// registries: PEM CA to verify the registry with (default: system store)")
    p.add_argument("--registry-tls-cert", metavar="FILE", help="PEM client certificate for the registry")
    p.add_argument("--registry-tls-key", metavar="FILE", help="PEM private key of --registry-tls-cert")
    p.add_argument("--handler-timeout", type=float, metavar="S", help="deadline for requests without __ServerTimeout")
    p.add_argument("--max-sync-workers", type=int, default=32, help="thread pool of sync handlers (default 32)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, help="drain deadline at shutdown (default 10 s)")
    add_server_tls_arguments(p, "rpcx over TLS (and https://) on --listen, https:// on --gateway")
    p.add_argument("--file-transfer", metavar="DIR",
                   help="serve rpcx's _filetransfer service: uploads (SendFile) stored in DIR, downloads "
                        "(DownloadFile) read from it; the bytes go over --file-transfer-listen, without TLS")
    p.add_argument("--file-transfer-listen", metavar="HOST:PORT",
                   help="listener of --file-transfer (default: the host of --listen, a free port)")
    p.add_argument("--file-transfer-advertise", metavar="HOST:PORT",
                   help="address given to clients for --file-transfer (default: the listener's, a wildcard "
                        "host replaced by the address the client reached the server at)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="run an RPC server", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def _hostport(value: str, flag: str) -> tuple[str, int]:
    from rustext.net import parse_hostport

    return parse_hostport(value, what=flag, default_host="127.0.0.1")


def _reload_tls(tls: Any, context: Any, process: Any = None) -> None:
    """SIGHUP: read the certificate files again; new handshakes get the
    new certificate, established connections keep theirs (logged; the
    current certificate stays when the new files are unusable)."""
    import logging

    from rustext.tls import TlsConfigError

    log = logging.getLogger("rpc.serve")
    if tls is None:
        log.info("SIGHUP: no TLS certificate to reload")
        return
    try:
        tls.reload(context)
        listener = getattr(process, "listener", None)
        if listener is not None and listener.endpoint.kind == "quic":
            listener.reload_tls()  # QUIC holds the certificate outside the ssl context
        log.info("TLS certificate reloaded from %s", tls.cert)
    except TlsConfigError as exc:
        log.error("TLS certificate not reloaded: %s", exc)


def _add_group(server: Any, group: str) -> None:
    """Append ``group=NAME`` to the metadata of every registered service."""
    from urllib.parse import parse_qsl, urlencode

    if not group:
        raise ValueError("--group needs a name")
    for service in server.registry.services.values():
        if any(k == "group" for k, _ in parse_qsl(service.metadata, keep_blank_values=True)):
            raise ValueError(f"service {service.name} already has a group in its metadata ({service.metadata!r})")
        pair = urlencode({"group": group})
        service.metadata = f"{service.metadata}&{pair}" if service.metadata else pair


async def serve(args: argparse.Namespace) -> int:
    from cli.lifecycle import StartError
    from cli.lifecycle import serve as serve_until_signalled
    from rpc.examples import register_example
    from rpc.plugins import AccessLogPlugin, AuthPlugin, ConnRateLimitPlugin, MetricsPlugin, ReqRateLimitPlugin
    from rpc.server import Server, load_app
    from rustext.appspec import AppImportError, cwd_on_path

    prog = "juggler rpc serve"
    if not args.listen and not args.gateway and not args.grpc:
        print(f"{prog}: give --listen, --gateway and/or --grpc", file=sys.stderr)
        return 2
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        print(f"{prog}: --idle-timeout must be > 0", file=sys.stderr)
        return 2
    from rustext.tls import TlsConfigError

    try:
        tls = server_tls(args)
        tls_context = tls.context() if tls is not None else None
        if tls is not None and args.listen and args.listen.startswith("unix@"):
            raise ValueError("TLS is for TCP listeners; --listen is a Unix socket")
        if tls is None and args.listen and args.listen.startswith(("quic@", "quic://")):
            raise ValueError("QUIC always encrypts: give --tls-cert and --tls-key with a quic@ listener")
        if args.tls_client_ca and args.listen and args.listen.startswith(("quic@", "quic://")):
            raise ValueError("--tls-client-ca: mutual TLS is not available over QUIC (serve it over TCP)")
        kcp = kcp_options(args, required=uses_kcp(args.listen))
        if tls is not None and uses_kcp(args.listen):
            raise ValueError("TLS is for TCP and QUIC listeners: a kcp@ listener encrypts with its --kcp-key")
        if kcp is not None and not uses_kcp(args.listen):
            raise ValueError("the --kcp-* options are for a kcp@HOST:PORT listener")
        gateway_at = _hostport(args.gateway, "--gateway") if args.gateway else None
        grpc_at = _hostport(args.grpc, "--grpc") if args.grpc else None
        config = None
        if args.listen:
            from rpc.transport.config import ConnectionConfig, ServerConfig

            config = ServerConfig(
                connection=ConnectionConfig(max_frame=args.max_message, max_decompressed=args.max_message),
                max_connections=args.max_connections,
            )
    except (TlsConfigError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    plugins: list[object] = []
    metrics = None
    if args.conn_rate_limit:
        plugins.append(ConnRateLimitPlugin(args.conn_rate_limit))
    if args.rate_limit:
        plugins.append(ReqRateLimitPlugin(args.rate_limit))
    if args.auth:
        plugins.append(AuthPlugin(args.auth))
    jwt_plugin = None
    if args.jwks_url or args.jwt_public_key or args.jwt_secret:
        from rpc.plugins import JwtAuthPlugin
        from rustext.tokens import TokenConfig

        try:
            jwt_plugin = JwtAuthPlugin.from_config(TokenConfig(
                secret=args.jwt_secret or "", public_key=args.jwt_public_key or "", jwks_url=args.jwks_url or "",
                audience=args.jwt_audience or "", issuer=args.jwt_issuer or ""))
        except (TlsConfigError, ValueError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        plugins.append(jwt_plugin)
    elif args.jwt_audience or args.jwt_issuer:
        print(f"{prog}: --jwt-audience and --jwt-issuer need --jwks-url, --jwt-public-key or --jwt-secret",
              file=sys.stderr)
        return 2
    if args.metrics_port is not None:
        metrics = MetricsPlugin()
        plugins.append(metrics)
    if args.access_log:
        plugins.append(AccessLogPlugin())
    from cli.otel import OtelSetupError, tracing_from_args

    try:
        tracing = tracing_from_args(args, "juggler-rpc")
    except OtelSetupError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if tracing is not None:
        from rpc.tracing import TracingPlugin

        plugins.insert(0, TracingPlugin())  # first: its span covers the other plugins' pre_call
    registrars: list[Any] = []
    try:
        registry_tls = None
        if args.registry_tls_ca or args.registry_tls_cert or args.registry_tls_key:
            from rustext.tls import ClientTls

            registry_tls = ClientTls(ca=args.registry_tls_ca, cert=args.registry_tls_cert, key=args.registry_tls_key)
        if args.redis:
            from rpc.discovery.redis import RedisRegistrar

            registrars.append(RedisRegistrar(args.redis, base=args.base, ttl=args.ttl, tls=registry_tls,
                                             layout=args.redis_layout))
        elif args.etcd:
            from rpc.discovery.etcd import EtcdRegistrar

            registrars.append(EtcdRegistrar(args.etcd, base=args.base, ttl=max(2, round(args.ttl)), tls=registry_tls))
        elif args.zookeeper:
            from rpc.discovery.zookeeper import ZooKeeperRegistrar

            if registry_tls is not None:
                raise ValueError("--registry-tls-* options are not supported with --zookeeper")
            registrars.append(ZooKeeperRegistrar(args.zookeeper, base=args.base, ttl=args.ttl))
        elif args.consul:
            from rpc.discovery.consul import MIN_TTL, ConsulRegistrar

            if registry_tls is not None:
                raise ValueError("--registry-tls-* options are not supported with --consul")
            registrars.append(ConsulRegistrar(args.consul, base=args.base, ttl=max(MIN_TTL, args.ttl)))
        elif registry_tls is not None:
            raise ValueError("--registry-tls-* options need a registry (--redis rediss://… or --etcd https://…)")
    except (TlsConfigError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    server = Server(plugins=plugins, registrars=registrars, max_sync_workers=args.max_sync_workers,
                    handler_timeout=args.handler_timeout)
    try:
        if args.example:
            register_example(server.registry, args.example)
        else:
            cwd_on_path()
            load_app(args.app, server)
    except (AppImportError, TypeError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.metadata:
        for service in server.registry.services.values():
            service.metadata = args.metadata
    if args.file_transfer_listen and not args.file_transfer:
        print(f"{prog}: --file-transfer-listen needs --file-transfer DIR", file=sys.stderr)
        return 2
    if args.file_transfer:
        from rpc.filetransfer import FileTransfer

        try:
            listen_host = args.listen.partition("@")[2] if args.listen and "@" in args.listen else args.listen
            if listen_host and listen_host.startswith("/"):
                listen_host = None
            default_at = f"{listen_host.rpartition(':')[0] or '127.0.0.1'}:0" if listen_host else "127.0.0.1:0"
            FileTransfer.for_directory(args.file_transfer, args.file_transfer_listen or default_at,
                                       advertise=args.file_transfer_advertise).register(server)
        except ValueError as exc:
            print(f"{prog}: --file-transfer: {exc}", file=sys.stderr)
            return 2
    if args.group is not None:
        try:
            _add_group(server, args.group)
        except ValueError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2

    from rpc.runner import RpcOptions, RpcProcess, RpcStartError

    options = RpcOptions(
        listen=args.listen, http=not args.no_http, transport=config, idle_timeout=args.idle_timeout,
        tls_context=tls_context, tls_files=tls, kcp=kcp, gateway=gateway_at, grpc=grpc_at,
        metrics=(metrics, args.metrics_host, args.metrics_port) if metrics is not None else None,
        advertise=args.advertise, drain_timeout=args.shutdown_timeout,
        started_plugins=(jwt_plugin,) if jwt_plugin is not None else (),
    )

    async def start() -> RpcProcess:
        process = RpcProcess(server, options)
        try:
            await process.start()
        except RpcStartError as exc:
            raise StartError(str(exc)) from exc
        return process

    def ready(r: RpcProcess) -> None:
        where = ", ".join(
            x for x in (
                f"rpcx{' over TLS' if tls and r.listener.endpoint.kind == 'tcp' else ''} on {r.listener.address}"
                if r.listener is not None else "",
                f"{'https' if tls else 'http'} gateway on {r.gateway.host}:{r.gateway.port}" if r.gateway else "",
                f"grpc.aio Hello.Say on {r.grpc_address}" if r.grpc_server is not None else "",
                f"metrics on :{args.metrics_port}" if metrics is not None else "",
                *(f"{side.name} on {side.address}" for side in server.attached),
            ) if x
        )
        services = ", ".join(sorted(server.registry.services))
        # one start line, on stdout (the logs carry the transport's own line)
        print(f"rpc serve: {where}; services {services}", flush=True)
        if r.listener is not None and not r.listener.address.startswith("unix@"):
            client_options, note = "", ""
            if tls is not None:
                from cli.tls import client_ca_option

                client_options, note = client_ca_option(args.tls_cert)
                client_options = client_options or " --tls"
            if kcp is not None:
                client_options = (" --kcp-crypt none" if args.kcp_crypt == "none" else
                                  " --kcp-key-hex KEY" if args.kcp_key_hex else
                                  " --kcp-key PASSPHRASE" if args.kcp_salt == "rpcx-salt" else
                                  " --kcp-key PASSPHRASE --kcp-salt SALT")
            addr = r.listener.address.removeprefix("tcp@")
            target, arg = ("Arith.Mul", "'{\"A\": 6, \"B\": 7}'") if args.example == "arith" else \
                ("Service.Method", "'JSON'")
            print(f"call it with: juggler rpc call {addr} {target} {arg}{client_options}"
                  + (f"  ({note})" if note else ""), flush=True)

    holder: list[RpcProcess] = []

    async def start_kept() -> RpcProcess:
        holder.append(await start())
        return holder[0]

    try:
        status = await serve_until_signalled(prog, start_kept, ready=ready,
                                             reload=lambda r: _reload_tls(tls, tls_context, r))
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched
    if status == 0 and holder and not holder[0].drained:
        return 1
    return status


def run(args: argparse.Namespace) -> int:
    import logging

    import uvloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return uvloop.run(serve(args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="juggler rpc serve", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
