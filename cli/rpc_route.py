"""Options shared by ``juggler rpc call`` and ``juggler rpc bench`` for a
target that is a registry (``etcd://host:2379/rpcx``, ``redis://host:6379/rpcx``):
the XClient's selector, fail mode, retries and group, and the registry's TLS
(``rpc.discovery.url``)."""

from __future__ import annotations

import argparse
from typing import Any

#: rpcx's selector names (SelectMode, lower case) and ours → rpc.selector.make_selector's
SELECTORS: dict[str, str] = {
    "random": "random",
    "roundrobin": "roundrobin",
    "weightedroundrobin": "weighted",
    "consistenthash": "consistenthash",
    "latency": "latency",
    "leastlatency": "leastlatency",
}
ALIASES = {"randomselect": "random", "weighted": "weightedroundrobin", "hash": "consistenthash"}
FAIL_MODES = ("failfast", "failover", "failtry", "failbackup")

TARGET_HELP = "etcd://HOST:2379/BASE or redis://HOST:6379/BASE[?db=N&layout=juggler] (etcds://, rediss:// over TLS) " \
              "or zookeeper://HOST:2181/BASE or consul://HOST:8500/BASE: call " \
              "through the servers registered there by `juggler rpc serve --etcd/--redis/--zookeeper/--consul --base BASE`; " \
              "or dns://NAME:PORT (A/AAAA records) or dns+srv://NAME (SRV records) [?nameserver=IP[:PORT]&interval=S]: " \
              "call the servers that name resolves to"


def _selector(value: str) -> str:
    name = value.replace("-", "").replace("_", "").lower()
    name = ALIASES.get(name, name)
    if name not in SELECTORS:
        raise argparse.ArgumentTypeError(f"unknown selector {value!r} (choose from {', '.join(SELECTORS)})")
    return name


def add_route_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("through a registry (etcd://, redis://, zookeeper://, consul://, dns://, dns+srv://), "
                             "as rpcx's XClient")
    g.add_argument("--selector", type=_selector, default="random", metavar="NAME",
                   help=f"which server takes each call: {', '.join(SELECTORS)} "
                        "(weighted and hash are accepted too; default random, as rpcx)")
    g.add_argument("--fail-mode", choices=FAIL_MODES, default="failfast",
                   help="on a failed call: failfast (report it), failover (retry another server), "
                        "failtry (retry the same one), failbackup (a second server if the first is slow) "
                        "(default failfast, as rpcx)")
    g.add_argument("--retries", type=int, default=3, metavar="N",
                   help="retries of failover and failtry (default 3, as rpcx)")
    g.add_argument("--group", metavar="NAME",
                   help="only servers registered with this group (`juggler rpc serve --group NAME`)")
    g.add_argument("--registry-tls-ca", metavar="FILE",
                   help="etcds:// or rediss:// registries: PEM CA to verify the registry with (default: system store)")
    g.add_argument("--registry-tls-cert", metavar="FILE", help="PEM client certificate for the registry")
    g.add_argument("--registry-tls-key", metavar="FILE", help="PEM private key of --registry-tls-cert")


def route_of(args: argparse.Namespace, target: str) -> Any:
    """The ``rpc.discovery.url.RegistryRoute`` of ``target`` and the route
    options, or None when ``target`` is a server's address (then the route
    options are refused). Raises ValueError or TlsConfigError (exit 2)."""
    from rpc.discovery.url import RegistryRoute, RegistryURL, is_registry_url

    route_flags = [f for f, given in (
        ("--selector", args.selector != "random"), ("--fail-mode", args.fail_mode != "failfast"),
        ("--retries", args.retries != 3), ("--group", args.group is not None),
        ("--registry-tls-*", bool(args.registry_tls_ca or args.registry_tls_cert or args.registry_tls_key)),
    ) if given]
    if not is_registry_url(target):
        if "://" in target.partition("@")[0] and not target.startswith(("http://", "https://", "grpc://")):
            # a mistyped scheme: neither a registry nor a server's address
            RegistryURL.parse(target)
        if route_flags:
            raise ValueError(f"{', '.join(route_flags)}: only for a registry target (etcd://…, redis://…), "
                             f"not the address {target!r}")
        return None
    if args.group is not None and not args.group:
        raise ValueError("--group needs a name")
    registry = RegistryURL.parse(target)  # the URL's mistakes first, then the files'
    if args.registry_tls_ca or args.registry_tls_cert or args.registry_tls_key:
        from rustext.tls import ClientTls

        if not registry.secure:
            RegistryURL.parse(target, tls=ClientTls())  # says which scheme it takes
        registry_tls = ClientTls(ca=args.registry_tls_ca, cert=args.registry_tls_cert, key=args.registry_tls_key)
        registry_tls.context()  # a bad file is reported now, naming it
        registry = RegistryURL.parse(target, tls=registry_tls)
    return RegistryRoute(registry=registry, selector=SELECTORS[args.selector],
                         fail_mode=args.fail_mode, retries=args.retries, group=args.group or "")
