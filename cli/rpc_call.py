"""``juggler rpc call``: call one method and print the reply as JSON.

Wired by ``cli/rpc.py`` (``rpc_call.register(rpc_subparsers)``); also runs
alone: ``python -m cli.rpc_call http://127.0.0.1:8080 Arith.Mul '{"A":6,"B":7}'``.
The target is a server's address, or a registry (``etcd://host:2379/rpcx``,
``redis://host:6379/rpcx``, ``dns://name:8972``, ``dns+srv://name``): then an XClient calls one of the servers
registered there for the service, with ``--selector``, ``--fail-mode`` and
``--group`` as rpcx's XClient takes them.
Exit code 0 on a reply, 1 when the call failed (``(error) ...`` on stderr) or
the registry has no server for the service or cannot be reached, 2 on usage
errors (a bad registry URL among them).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from typing import Any

from cli.otel import add_otel_argument
from cli.rpc_route import TARGET_HELP, add_route_arguments, route_of
from cli.kcp import add_kcp_arguments, kcp_options, uses_kcp
from cli.tls import add_client_tls_arguments, client_tls

DESCRIPTION = ("Call one method of an rpcx server, an HTTP gateway or a server found in a registry, "
               "and print the reply as JSON.")

EPILOG = """examples:
  juggler rpc call 127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}'                # rpcx protocol
  juggler rpc call http://127.0.0.1:8080 Arith.Mul '{"A":6,"B":7}'         # HTTP gateway (ours or Go rpcx's)
  juggler rpc call http://127.0.0.1:8080 Arith.Add '{"A":1,"B":2}' --codec msgpack --timeout 2
  juggler rpc call 127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --tls-ca certs/ca.pem   # rpcx over TLS
  juggler rpc call quic@127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --tls-ca certs/ca.pem   # rpcx over QUIC
  juggler rpc call kcp@127.0.0.1:8972 Arith.Mul '{"A":6,"B":7}' --kcp-key rpcx-key      # rpcx over KCP
  juggler rpc call https://127.0.0.1:8080 Arith.Mul '{"A":6,"B":7}' --tls-ca certs/ca.pem
  juggler rpc call etcd://127.0.0.1:2379/rpcx Arith.Mul '{"A":6,"B":7}'   # a server registered in etcd
  juggler rpc call redis://127.0.0.1:6379/rpcx Arith.Mul '{"A":6,"B":7}' --selector roundrobin --fail-mode failover
  juggler rpc call etcd://127.0.0.1:2379/rpcx Arith.Mul '{"A":6,"B":7}' --group canary
  juggler rpc call zookeeper://127.0.0.1:2181/rpcx Arith.Mul '{"A":6,"B":7}'   # registered in ZooKeeper (Go too)
  juggler rpc call consul://127.0.0.1:8500/rpcx Arith.Mul '{"A":6,"B":7}'   # registered in Consul (Go too)
  juggler rpc call etcds://10.0.0.2:2379/rpcx Arith.Mul '{"A":6,"B":7}' --registry-tls-ca certs/ca.pem
  juggler rpc call dns://arith.default.svc.cluster.local:8972 Arith.Mul '{"A":6,"B":7}'   # a headless service
  juggler rpc call dns+srv://_rpcx._tcp.arith.default.svc.cluster.local Arith.Mul '{"A":6,"B":7}' --selector weighted
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", metavar="ADDR|REGISTRY",
                   help=f"host:port, tcp@host:port, quic@host:port or kcp@host:port (rpcx), http://host:port (gateway), or {TARGET_HELP}")
    p.add_argument("target", metavar="Service.Method")
    p.add_argument("args", metavar="JSON", nargs="?", default="null", help="the argument as JSON (default null)")
    p.add_argument("--codec", choices=("json", "msgpack"), default="json", help="payload codec (default json)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="call deadline (default 5 s)")
    p.add_argument("--auth", metavar="TOKEN", help="__AUTH token")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="request metadata (repeatable)")
    add_otel_argument(p)
    p.add_argument("--tls", action="store_true",
                   help="rpcx over TLS, verified against the system's trust store (implied by --tls-ca, --insecure)")
    add_client_tls_arguments(p, "TLS servers (rpcx, https:// gateways)")
    add_kcp_arguments(p)
    add_route_arguments(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "call", help="call a method and print the reply as JSON", description=DESCRIPTION,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


async def call(args: argparse.Namespace) -> int:
    from rpc.callers import open_caller
    from rpc.errors import RpcError
    from rpc.message import META_AUTH, META_SERVER_TIMEOUT, Message
    from rpc.transport.codec import CodecRegistry, serialize_type_from_name

    service, dot, method = args.target.rpartition(".")
    if not dot or not service or not method:
        print("error: target must be Service.Method", file=sys.stderr)
        return 2
    try:
        value = json.loads(args.args)
    except ValueError as exc:
        print(f"error: JSON argument: {exc}", file=sys.stderr)
        return 2
    metadata: dict[str, str] = {}
    for item in args.meta:
        k, sep, v = item.partition("=")
        if not sep:
            print(f"error: --meta needs KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        metadata[k] = v
    if args.auth:
        metadata[META_AUTH] = args.auth
    metadata[META_SERVER_TIMEOUT] = str(max(1, int(args.timeout * 1000)))
    st = serialize_type_from_name(args.codec)
    codec = CodecRegistry().get(st)
    from cli.otel import OtelSetupError, tracing_from_args

    try:
        tracing = tracing_from_args(args, "juggler-rpc-call")
    except OtelSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if tracing is not None:
        try:
            return await _traced_call(args, service, method, value, metadata, st, codec)
        finally:
            tracing.shutdown()  # exports the call's span before the process ends
    from rustext.tls import TlsConfigError

    try:
        tls = client_tls(args, force=args.tls)
        kcp = kcp_options(args, required=uses_kcp(args.address))
        route = route_of(args, args.address)
        # a registry's servers are rpcx servers (tcp@host:port), as rpc serve registers them
        caller, close = await open_caller("tcp@registry" if route is not None else args.address, tls=tls,
                                           kcp=kcp)
    except (LookupError, ValueError, TlsConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if route is not None:
            return await _call_through(route, caller, service, method, value, metadata, st, codec, args.timeout)
        res = await caller(args.address, Message(service_path=service, service_method=method, serialize_type=st,
                                                 metadata=metadata, payload=codec.encode(value)), args.timeout)
        if res is None:
            raise RpcError("no reply")
        if res.is_error:
            print(f"(error) {res.error_text}", file=sys.stderr)
            return 1
        reply = codec.decode(res.payload)
    except (RpcError, ValueError) as exc:
        print(f"(error) {type(exc).__name__}: {exc}", file=sys.stderr)
        await _explain(args.address, exc, tls=tls is not None)
        return 1
    finally:
        await close()
    print(json.dumps(_jsonable(reply), ensure_ascii=False))
    return 0


async def _explain(address: str, exc: BaseException, *, tls: bool) -> None:
    """A line more when an rpcx server could not be reached because its port
    is of the other kind (TLS dialled in clear, or clear dialled with TLS)."""
    from rpc.errors import CallTimeout, TransportError

    if isinstance(exc, (CallTimeout, TransportError)) and address.startswith(("kcp@", "kcp://")):
        print("(error) KCP has no handshake: a server that is not there, or that uses another --kcp-key, "
              "--kcp-crypt or shards, looks the same (no reply)", file=sys.stderr)
        return
    if not isinstance(exc, TransportError) or "://" in address or address.startswith(("unix@", "inproc")):
        return
    from cli.tls import other_kind_hint

    hint = await other_kind_hint(
        address, tls=tls,
        use_tls="call it over TLS (--tls, with --tls-ca FILE when its certificate is not in the system's trust "
                "store)",
        use_plain="call it without --tls / --tls-ca")
    if hint:
        print(f"(error) {hint}", file=sys.stderr)


async def _traced_call(args: argparse.Namespace, service: str, method: str, value: Any,
                       metadata: dict[str, str], st: Any, codec: Any) -> int:
    """The call with a CLIENT span (``rpc.tracing``), its context sent in the
    request metadata: through a ``Client`` or the registry's XClient, which
    run the tracing plugin's hooks."""
    from rpc.callers import open_caller
    from rpc.client import Client
    from rpc.errors import RpcError, ServiceError
    from rpc.tracing import TracingClientPlugin
    from rustext.tls import TlsConfigError

    try:
        tls = client_tls(args, force=args.tls)
        kcp = kcp_options(args, required=uses_kcp(args.address))
        route = route_of(args, args.address)
        caller, close = await open_caller("tcp@registry" if route is not None else args.address, tls=tls,
                                           kcp=kcp)
    except (LookupError, ValueError, TlsConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plugin = TracingClientPlugin()
    try:
        if route is not None:
            return await _call_through(route, caller, service, method, value, metadata, st, codec, args.timeout,
                                       plugins=(plugin,))
        client = Client(args.address, caller, serialize_type=st, plugins=[plugin])
        res = await client.call_message(service, method, value, timeout=args.timeout, metadata=metadata)
        reply = codec.decode(res.payload)
    except ServiceError as exc:
        print(f"(error) {exc}", file=sys.stderr)
        return 1
    except (RpcError, ValueError) as exc:
        print(f"(error) {type(exc).__name__}: {exc}", file=sys.stderr)
        await _explain(args.address, exc, tls=tls is not None)
        return 1
    finally:
        await close()
    print(json.dumps(_jsonable(reply), ensure_ascii=False))
    return 0


async def _call_through(route: Any, caller: Any, service: str, method: str, value: Any,
                        metadata: dict[str, str], st: Any, codec: Any, timeout: float,
                        plugins: tuple[object, ...] = ()) -> int:
    """One call through an XClient of ``route``: the selector picks a
    registered server, the fail mode handles a failure."""
    from rpc.errors import (
        NoServerAvailable,
        RegistryUnavailable,
        RpcError,
        ServiceError,
    )

    try:
        async with route.xclient(service, caller, serialize_type=st, timeout=timeout) as xc:
            for plugin in plugins:
                xc.plugins.add(plugin)
            try:
                res = await xc.call_message(method, value, metadata=metadata)
            except ServiceError as exc:
                print(f"(error) {exc}", file=sys.stderr)
                return 1
            except (RpcError, ValueError) as exc:
                print(f"(error) {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
    except (RegistryUnavailable, NoServerAvailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(_jsonable(codec.decode(res.payload)), ensure_ascii=False))
    return 0


def run(args: argparse.Namespace) -> int:
    import logging

    import uvloop

    # one call: its outcome is the message; the pool's "lost; reconnecting" would only say it twice
    logging.getLogger("rpc.transport.pool").setLevel(logging.ERROR)
    return uvloop.run(call(args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="juggler rpc call", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
