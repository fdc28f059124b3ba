"""``juggler seq``: up / server / client / member / bench / snowflake / decode for the sequence service (seq/)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.options import log_level
from cli.tls import add_client_tls_arguments, client_tls

EPILOG = """examples:
  juggler seq up                                   # a local 3-member cluster in one command, then:
  juggler seq client orders --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 --count 5
  # a brand-new 3-member cluster by hand (one terminal, or one machine, each)
  juggler seq server --listen 127.0.0.1:19001 --data /var/lib/seq1 --peers 127.0.0.1:19002,127.0.0.1:19003 --bootstrap
  juggler seq server --listen 127.0.0.1:19002 --data /var/lib/seq2 --peers 127.0.0.1:19001,127.0.0.1:19003 --bootstrap
  juggler seq server --listen 127.0.0.1:19003 --data /var/lib/seq3 --peers 127.0.0.1:19001,127.0.0.1:19002 --bootstrap
  # later restarts: same command without --bootstrap; after losing a data dir: --rejoin
  # the same from a file (listen = "127.0.0.1:19001", data_dir = …, peers = [...]; flags override it)
  juggler seq server --config /etc/seq/seq1.toml --bootstrap
  juggler seq client myseq --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 --buf 100 --count 5
  juggler seq bench --clients 32 --buf 0 --duration 3      # starts its own 3-member cluster
  # over TLS: each member with its certificate and the CA (juggler tls dev-cert --out certs)
  juggler seq server --listen 127.0.0.1:19001 --data /var/lib/seq1 --peers ... \\
      --tls-cert certs/cert.pem --tls-key certs/key.pem --tls-ca certs/ca.pem
  juggler seq client myseq --servers 127.0.0.1:19001,... --tls-ca certs/ca.pem
  # the HTTP/JSON API beside gRPC: --http 127.0.0.1:18001, then
  curl 'http://127.0.0.1:18001/v1/next/myseq?count=100'
  # replace a member: start the new one with --join, add it, then remove the old one
  juggler seq server --listen 127.0.0.1:19004 --data /var/lib/seq4 --join
  juggler seq member add 127.0.0.1:19004 --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003
  juggler seq member remove 127.0.0.1:19003 --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19004
  juggler seq member list --servers 127.0.0.1:19001
"""

MEMBER_EPILOG = """examples:
  juggler seq member list --servers 127.0.0.1:19001,127.0.0.1:19002
  juggler seq member list --servers 127.0.0.1:19001 --json
  juggler seq server --listen 127.0.0.1:19004 --data /var/lib/seq4 --join     # the new member, first
  juggler seq member add 127.0.0.1:19004 --servers 127.0.0.1:19001,127.0.0.1:19002
  juggler seq member remove 127.0.0.1:19003 --servers 127.0.0.1:19001,127.0.0.1:19002

One change at a time; a change that stopped halfway is finished by running the
same command again. exit status: 0 done, 1 could not be done (unreachable
members, another change in progress), 2 asked wrongly.
"""


CLIENT_EPILOG = """examples:
  juggler seq client orders --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 --count 5
  juggler seq client orders --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 --buf 100 --count 0
  juggler seq client orders --servers 127.0.0.1:19001 --tls-ca certs/ca.pem    # a cluster over TLS
"""


def _addrs(value: str) -> list[str]:
    return [a.strip() for a in value.split(",") if a.strip()]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "seq",
        help="sequence (ID) service: up / server / client / member / bench / snowflake / decode",
        description="Unique, increasing IDs from a cluster of members that agree by read and write quorums "
        "(it keeps serving while a majority of members is up), and time-ordered 64-bit IDs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="seq_command", metavar="SUBCOMMAND")
    from cli import seq_up

    seq_up.register(sub)

    s = sub.add_parser("server", help="run one cluster member",
                       description="Run one member of a seq cluster. A new cluster's members all start with "
                       "--bootstrap and --peers naming the others; later starts need neither (the data directory "
                       "keeps the configuration).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--config", metavar="FILE",
                   help="TOML file of settings named as in the configuration reference (listen, data_dir, peers, "
                        "http, tls_cert, …, and metrics_port, log_level); flags override it")
    s.add_argument("--listen", metavar="HOST:PORT", help="address of the gRPC API (required, here or in --config)")
    s.add_argument("--data", metavar="DIR", help="data directory (log + meta.json; required, here or in --config)")
    s.add_argument("--peers", metavar="HOST:PORT,...",
                   help="the OTHER members, for --bootstrap and --rejoin; a member's data directory keeps "
                        "the configuration it is in, which wins over --peers later")
    s.add_argument("--advertise", metavar="HOST:PORT", help="this member's address as peers list it (default --listen)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--bootstrap", action="store_true",
                      help="empty data dir, brand-new cluster: start once all members answer")
    mode.add_argument("--rejoin", action="store_true",
                      help="data lost: catch up from ALL other members before voting (the members are asked "
                           "for the configuration; --peers names some of them)")
    mode.add_argument("--join", action="store_true",
                      help="empty data dir, a member to be added to a running cluster: it waits for "
                           "'juggler seq member add' (no --peers needed)")
    s.add_argument("--timeout", type=float, help="NextID deadline when the client sends none (s) [5]")
    s.add_argument("--peer-timeout", type=float, help="bound of one member-to-member call (s) [1]")
    s.add_argument("--no-forward", action="store_const", const=True,
                   help="coordinate every request here instead of forwarding to the name's preferred member")
    s.add_argument("--max-inflight", type=int, help="concurrent quorum rounds per name [1]")
    s.add_argument("--max-pending", type=int,
                   help="NextID calls waiting for an answer at most; beyond, calls are refused at once with "
                        "RESOURCE_EXHAUSTED (clients back off and try another member) [10000]")
    s.add_argument("--linger-ms", type=float,
                   help="under load (the previous round of a name served >= 4 requests) the next round waits this long to batch more (ms; 0: off) [1]")
    s.add_argument("--peer-port", type=int,
                   help="port of the member-to-member transport on the --listen host (default 0: any free port; "
                        "peers learn it over gRPC)")
    s.add_argument("--http", metavar="HOST:PORT",
                   help="serve the HTTP/JSON API on this address: GET /v1/next/NAME?count=N, /v1/current/NAME, "
                        "POST /v1/set/NAME, GET /v1/names, /healthz, /readyz, a status page at / and /metrics "
                        "(HTTPS with --tls-cert/--tls-key)")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")
    s.add_argument("--metrics-max-names", type=int, metavar="N",
                   help="names with per-name metric series of their own (the first N served); later names are "
                        "counted together under name=\"_other\" [1000]")
    s.add_argument("--log-level", type=log_level, help="DEBUG, INFO, WARNING or ERROR [INFO]")
    s.add_argument("--tls-cert", metavar="FILE",
                   help="PEM certificate chain: RRAPI over TLS, and this member's certificate to the others "
                        "(reloaded on SIGHUP)")
    s.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (ECDSA or RSA)")
    s.add_argument("--tls-ca", metavar="FILE",
                   help="PEM CA the members' certificates chain to: each member verifies the others with it")
    s.set_defaults(func=run_server)

    c = sub.add_parser("client", help="draw IDs and print them, one a line",
                       description="Draw IDs of a sequence from the cluster and print them, one a line. With "
                       "--buf N the client fetches ranges of N IDs ahead and hands them out locally, as an "
                       "application's client does.",
                       epilog=CLIENT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("name", help="sequence name")
    c.add_argument("--servers", required=True, metavar="HOST:PORT,...")
    c.add_argument("--buf", type=int, default=0, help="buffer size (IDs fetched ahead)")
    c.add_argument("--count", type=int, default=10, help="IDs to draw (0: until interrupted)")
    c.add_argument("--timeout", type=float, default=5.0, help="bound of one fetch (s)")
    c.add_argument("--tls", action="store_true",
                   help="gRPC over TLS, verified against the system's trust store (implied by --tls-ca, --insecure)")
    add_client_tls_arguments(c, "the servers")
    c.set_defaults(func=run_client)

    b = sub.add_parser("bench", help="IDs/s and latency of a cluster, beside a single-process counter",
                       description="Measure IDs/s and latency of --clients concurrent clients drawing from a "
                       "cluster (a local 3-member one unless --servers), beside the same clients drawing from an "
                       "in-process counter (the ceiling of the client side), in the same run.")
    b.add_argument("--servers", default="", metavar="HOST:PORT,...", help="default: start a local 3-member cluster")
    b.add_argument("--clients", type=int, default=32)
    b.add_argument("--buf", type=int, default=0)
    b.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    b.add_argument("--name", default="bench")
    b.set_defaults(func=run_bench)

    m = sub.add_parser("member", help="list, add or remove members (one change at a time)", epilog=MEMBER_EPILOG,
                       description="See and change which members make up a running cluster.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    msub = m.add_subparsers(dest="member_command", metavar="ACTION")
    for name, what, long in (
        ("list", "the configuration: members, epoch, each member's state",
         "Show the cluster's configuration (its members and epoch) and each member's state, as the members "
         "answer."),
        ("add", "add a member started with --join",
         "Add a member to the cluster: start it first with `juggler seq server --join`; it catches up from "
         "the others, then votes."),
        ("remove", "remove a member (it may be down)",
         "Remove a member from the cluster, running or not; once removed it serves nothing."),
    ):
        a = msub.add_parser(name, help=what, description=long, epilog=MEMBER_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if name != "list":
            a.add_argument("member", metavar="HOST:PORT", help="the member's address, as --listen/--advertise gave it")
        a.add_argument("--servers", required=True, metavar="HOST:PORT,...",
                       help="members of the cluster to ask (one that answers is enough; the others are found)")
        a.add_argument("--json", action="store_true", help="print JSON instead of text")
        a.add_argument("--timeout", type=float, default=5.0, help="bound of each call to a member (s)")
        a.add_argument("--tls-ca", metavar="FILE", help="the members' CA (a cluster running with --tls-ca)")
        a.add_argument("--tls-cert", metavar="FILE", help="a certificate the members accept (signed by their CA)")
        a.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
        a.set_defaults(func=run_member, action=name)
    m.set_defaults(func=lambda args: (m.print_help(), 2)[1])

    f = sub.add_parser(
        "snowflake", help="run a time-ordered ID worker that leases its worker ID from the cluster",
        description="Serve 64-bit time-ordered IDs (Snowflake layout: 41 bits of ms since --epoch, 10 bits of "
                    "worker ID, 12 bits of sequence) on the same gRPC and HTTP APIs as a member. The worker ID is "
                    "leased from the seq cluster; the worker stops serving when it cannot renew its lease.",
        epilog=SNOWFLAKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--config", metavar="FILE",
                   help="TOML file of settings named as in the configuration reference (cluster, listen, http, "
                        "epoch, bits, …, and log_level); flags override it")
    f.add_argument("--cluster", metavar="HOST:PORT,...",
                   help="members' gRPC addresses, as the members list each other (the worker takes the current "
                         "member list from them; required, here or in --config)")
    f.add_argument("--listen", metavar="HOST:PORT",
                   help="gRPC address of this worker (required, here or in --config)")
    f.add_argument("--http", metavar="HOST:PORT", help="serve the HTTP/JSON API on this address")
    _layout_arguments(f, defaults=False)
    f.add_argument("--max-clock-backward-ms", type=int, metavar="MS",
                   help="a clock at most this far behind the last millisecond used is waited out; further "
                        "behind, requests fail with clock_moved_backwards (default 5)")
    f.add_argument("--lease-ttl-ms", type=int, metavar="MS",
                   help="each renewal extends the lease this far (default 10000; renewed every third of it)")
    f.add_argument("--lease-margin-ms", type=int, metavar="MS",
                   help="stop serving this long before the lease expires when it could not be renewed "
                        "(default 2000)")
    f.add_argument("--max-clock-skew-ms", type=int, metavar="MS",
                   help="how far the workers' clocks may disagree: an expired lease is taken only this long "
                        "after its expiry (default 1000)")
    f.add_argument("--timeout", type=float, help="request deadline when the client sends none (s) [5]")
    f.add_argument("--peer-timeout", type=float, help="bound of one call to a member (s) [1]")
    f.add_argument("--test-clock-control", action="store_true", help=argparse.SUPPRESS)
    f.add_argument("--log-level", type=log_level, help="DEBUG, INFO, WARNING or ERROR [INFO]")
    f.set_defaults(func=run_snowflake)

    d = sub.add_parser("decode", help="split a snowflake ID into time, worker and sequence (JSON)",
                       description="Print {\"id\", \"time\", \"ms\", \"worker\", \"sequence\"} of a "
                                   "snowflake ID as JSON. Use the --epoch and --bits the workers use.")
    d.add_argument("id", metavar="ID", help="the ID, a decimal integer from 0 to 2**63-1")
    _layout_arguments(d)
    d.set_defaults(func=run_decode)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


SNOWFLAKE_EPILOG = """examples:
  # beside a 3-member cluster (see juggler seq server --help)
  juggler seq snowflake --cluster 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 \\
      --listen 127.0.0.1:19101 --http 127.0.0.1:18101
  curl 'http://127.0.0.1:18101/v1/next/orders?count=10'
  juggler seq decode 1234567890123456789
"""


def _layout_arguments(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    from seq.snowflake import DEFAULT_EPOCH

    p.add_argument("--epoch", default=DEFAULT_EPOCH if defaults else None, metavar="TIME",
                   help=f"time 0 of the IDs, ISO 8601 with a zone (default {DEFAULT_EPOCH})")
    p.add_argument("--bits", default="41,10,12" if defaults else None, metavar="TIME,WORKER,SEQUENCE",
                   help="the bit split, adding up to 63 (default 41,10,12)")


def run_snowflake(args: argparse.Namespace) -> int:
    import logging

    try:
        config, level = worker_config(args)
    except ValueError as exc:
        print(f"juggler seq snowflake: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(_run(_serve_worker(config)))


def worker_config(args: argparse.Namespace) -> tuple[Any, str]:
    """The snowflake worker's WorkerConfig and log level: ``--config``'s file
    with the flags given on top; ValueError naming the file and line."""
    from seq.configfile import ConfigFile, build
    from seq.snowflake import parse_bits
    from seq.worker import WorkerConfig

    file = (ConfigFile(args.config, WorkerConfig, flag_only={"test_clock": "--test-clock-control"},
                       extra={"log_level": log_level})
            if args.config else None)
    given = {
        "cluster": tuple(_addrs(args.cluster)) if args.cluster is not None else None,
        "listen": args.listen, "http": args.http, "epoch": args.epoch,
        "bits": parse_bits(args.bits) if args.bits is not None else None,
        "max_backward_ms": args.max_clock_backward_ms, "lease_ttl_ms": args.lease_ttl_ms,
        "lease_margin_ms": args.lease_margin_ms, "max_clock_skew_ms": args.max_clock_skew_ms,
        "timeout": args.timeout, "peer_timeout": args.peer_timeout,
        "test_clock": True if args.test_clock_control else None,
    }
    flags = {k: v for k, v in given.items() if v is not None}
    config = build(WorkerConfig, flags, file, probe={"cluster": ("127.0.0.1:1",), "listen": "127.0.0.1:2"},
                   names={"cluster": "--cluster", "listen": "--listen"})
    return config, args.log_level or (file.extra.get("log_level") if file else None) or "INFO"


async def _serve_worker(config: Any) -> int:
    from cli.lifecycle import StartError, serve
    from rustext.net import ListenError
    from seq.runner import start_worker

    async def start() -> Any:
        try:
            return await start_worker(config)
        except ListenError:
            raise
        except (OSError, ValueError) as exc:
            raise StartError(str(exc)) from exc

    return await serve("juggler seq snowflake", start)


def run_decode(args: argparse.Namespace) -> int:
    import json

    from seq.snowflake import Layout, decode, parse_bits, parse_epoch

    text = args.id.strip()
    try:
        t, w, s = parse_bits(args.bits)
        layout = Layout(epoch_ms=parse_epoch(args.epoch), time_bits=t, worker_bits=w, sequence_bits=s)
        if not text.isdigit() or not text.isascii() or len(text) > 19 or int(text) >= 1 << 63:
            raise ValueError(f"ID must be a decimal integer from 0 to 2**63-1 (got {text[:40]!r})")
        print(json.dumps(decode(int(text), layout)))
    except (ValueError, OverflowError, OSError) as exc:
        print(f"juggler seq decode: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(coro: Any) -> Any:
    import asyncio
    import os

    if os.environ.get("SEQ_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop

            return uvloop.run(coro)
        except ImportError:  # pragma: no cover
            pass
    return asyncio.run(coro)


def run_server(args: argparse.Namespace) -> int:
    import logging

    from rustext.tls import TlsConfigError

    try:
        config, metrics_port, level = member_config(args)
    except ValueError as exc:
        print(f"juggler seq server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if config.tls:
            config.peer_server_tls().context()  # type: ignore[union-attr]  # a bad file, named, before anything starts
            config.peer_client_tls().context()  # type: ignore[union-attr]
    except TlsConfigError as exc:
        print(f"juggler seq server: {exc}", file=sys.stderr)
        return 2
    return int(_run(_serve_member(config, metrics_port)))


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"expected a port number, got {value!r}")
    return value


def member_config(args: argparse.Namespace) -> tuple[Any, int | None, str]:
    """The member's ServerConfig, metrics port and log level: ``--config``'s
    file with the flags given on top; ValueError naming the file and line."""
    from seq.configfile import ConfigFile, build
    from seq.startup import ServerConfig

    file = (ConfigFile(args.config, ServerConfig, flag_only={"mode": "--bootstrap, --rejoin or --join"},
                       extra={"metrics_port": _port, "log_level": log_level})
            if args.config else None)
    given = {
        "listen": args.listen, "data_dir": args.data, "advertise": args.advertise,
        "peers": tuple(_addrs(args.peers)) if args.peers is not None else None,
        "default_timeout": args.timeout, "peer_timeout": args.peer_timeout,
        "forward": False if args.no_forward else None, "max_inflight": args.max_inflight,
        "max_pending": args.max_pending,
        "linger": args.linger_ms / 1000 if args.linger_ms is not None else None,
        "peer_port": args.peer_port, "http": args.http, "metrics_max_names": args.metrics_max_names,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_ca": args.tls_ca,
    }
    flags = {k: v for k, v in given.items() if v is not None}
    flags["mode"] = "bootstrap" if args.bootstrap else "rejoin" if args.rejoin else "join" if args.join else "normal"
    config = build(ServerConfig, flags, file, probe={"listen": "127.0.0.1:1", "data_dir": "."},
                   names={"listen": "--listen", "data_dir": "--data"})
    extra = file.extra if file else {}
    metrics_port = args.metrics_port if args.metrics_port is not None else extra.get("metrics_port")
    level = args.log_level or extra.get("log_level") or "INFO"
    return config, metrics_port, level


async def _serve_member(config: Any, metrics_port: int | None) -> int:
    from cli.lifecycle import StartError, say, serve
    from rustext.net import ListenError
    from seq.errors import SeqError, UnsafeStart
    from seq.runner import MemberProcess, start_member

    prog = "juggler seq server"

    async def start() -> MemberProcess:
        try:
            return await start_member(config, metrics_port)
        except UnsafeStart as exc:
            raise StartError(f"refusing to start: {exc}", status=2) from exc
        except ListenError:
            raise
        except (SeqError, OSError, ValueError) as exc:
            raise StartError(str(exc)) from exc

    async def until_fatal(m: MemberProcess) -> None:
        try:
            await m.server.serve_forever()
        except (SeqError, OSError) as exc:  # the member had to stop (its store failed, …)
            say(prog, f"stopping: {exc}")

    def ready(m: MemberProcess) -> None:
        if config.tls and config.tls_cert:
            import logging

            from cli.tls import client_ca_option

            option, note = client_ca_option(config.tls_cert)
            servers = ",".join(m.server.configuration[1]) or config.self_address
            logging.getLogger("seq.server").info(
                "clients connect over TLS: juggler seq client NAME --servers %s%s%s", servers, option or " --tls",
                f" ({note})" if note else "")

    return await serve(prog, start, ready=ready, wait=until_fatal,
                       reload=MemberProcess.reload_tls if config.tls else None)


def run_client(args: argparse.Namespace) -> int:
    from rustext.tls import TlsConfigError
    from seq.client import RRSeq
    from seq.errors import SeqError

    try:
        tls = client_tls(args, force=args.tls)
    except (TlsConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        async with RRSeq(args.name, args.buf, _addrs(args.servers), timeout=args.timeout, tls=tls) as s:
            k = 0
            async for i in s.stream():
                print(i, flush=args.count == 0)
                k += 1
                if args.count and k >= args.count:
                    break
        return 0

    try:
        return int(_run(main()))
    except SeqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _explain(_addrs(args.servers), tls=tls is not None)
        return 1


def _explain(servers: list[str], *, tls: bool) -> None:
    """A line more when the servers' ports are of the other kind (TLS
    dialled in clear, or clear dialled with TLS): the first one found."""
    import asyncio

    from cli.tls import other_kind_hint

    async def first() -> str:
        for addr in servers:
            hint = await other_kind_hint(
                addr, tls=tls, use_tls="connect over TLS (--tls-ca FILE, or --tls when its certificate is in the "
                "system's trust store)", use_plain="connect without --tls / --tls-ca")
            if hint:
                return hint
        return ""

    hint = asyncio.run(first())
    if hint:
        print(f"error: {hint}", file=sys.stderr)


def run_bench(args: argparse.Namespace) -> int:
    from rustext.interrupt import two_step_interrupt
    from seq.bench import bench_main

    box = {"stop": False}
    try:
        with two_step_interrupt(lambda: box.update(stop=True), prog="juggler seq bench"):
            status = int(_run(bench_main(args.servers and _addrs(args.servers), args.clients, args.buf,
                                         args.duration, args.name, stopped=lambda: box["stop"])))
    except KeyboardInterrupt:
        print("juggler seq bench: stopped", file=sys.stderr)
        return 130
    return 130 if box["stop"] else status


def run_member(args: argparse.Namespace) -> int:
    """``juggler seq member list|add|remove``: exit 0 done, 1 not done, 2 asked wrongly."""
    import json

    from rustext.tls import ClientTls, TlsConfigError
    from seq.errors import ChangeRefused, MembershipError
    from seq.membership import Admin
    from rustext.net import check_hostport

    prog = f"juggler seq member {args.action}"
    try:
        servers = [check_hostport(a) for a in _addrs(args.servers)]
        if not servers:
            raise ValueError("--servers names no member")
        if args.action != "list":
            check_hostport(args.member)
        if args.timeout <= 0:
            raise ValueError("--timeout must be > 0")
        tls = None
        if args.tls_cert or args.tls_key or args.tls_ca:
            if not (args.tls_cert and args.tls_key and args.tls_ca):
                raise ValueError("a cluster over TLS needs --tls-ca, --tls-cert and --tls-key (members verify "
                                 "each other's certificates)")
            tls = ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
            tls.context()
    except (ValueError, TlsConfigError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        async with Admin(timeout=args.timeout, tls=tls) as admin:
            if args.action == "list":
                conf = await admin.configuration(servers)
                print(json.dumps(conf.to_json(), indent=2) if args.json else _config_table(conf))
                return 0
            if args.action == "add":
                res = await admin.add(servers, args.member)
            else:
                res = await admin.remove(servers, args.member)
            if args.json:
                print(json.dumps(res.to_json(), indent=2))
            else:
                verb = "added" if res.action == "add" else "removed"
                print(f"{verb} {res.member}{' (a change left pending, finished)' if res.resumed else ''}: "
                      f"configuration epoch {res.epoch}, members {','.join(res.members)}")
                if res.missing:
                    print(f"not reached: {','.join(res.missing)} (they catch up from the others when they are back)")
                if res.action == "remove":
                    print(f"{res.member} serves nothing now: stop it and wipe its data directory; "
                          "give clients the new member list")
            return 0

    try:
        return int(_run(main()))
    except ChangeRefused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except MembershipError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


def _config_table(conf: Any) -> str:
    lines = [(f"configuration epoch {conf.epoch}: {len(conf.members)} members, quorum {conf.quorum} "
              f"(cluster {conf.cluster})")]
    rows = [("MEMBER", "IN CONFIG", "STATE", "EPOCH", "NOTE")]
    for addr in sorted(set(conf.members) | set(conf.views)):
        v = conf.views.get(addr)
        member = "yes" if addr in conf.members else "no"
        if v is None or not v.reachable:
            rows.append((addr, member, "unreachable", "-", v.error if v is not None else "not asked"))
            continue
        note = ""
        if v.pending is not None:
            note = f"fenced for a change to epoch {v.pending['epoch']}"
        elif v.epoch < conf.epoch and v.state != "joining":
            note = "behind: catches up when it hears from the others"
        rows.append((addr, member, v.state.replace("_", " "), str(v.epoch), note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    pend = conf.pending()
    if pend:
        p = pend[0][1]
        lines.append(f"pending change: to epoch {p['epoch']}, members {','.join(p['members'])}; finish it by "
                     "running the command that started it again")
    return "\n".join(lines)
