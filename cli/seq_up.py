"""``juggler seq up``: a local three-member seq cluster in one command.

What ``juggler up`` is for juggler: three real ``juggler seq server``
processes on loopback (ports N, N+1, N+2 of ``--listen``), their data in one
folder that the start line names. The first run bootstraps the cluster; a
later run in the same folder starts the same cluster again, so the IDs it
hands out go on increasing. A member that dies is reported (its log's last
lines) while the two others keep serving. Ctrl-C stops the members (their
answers in flight are sent first); a second Ctrl-C kills them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXAMPLES = """examples:
  juggler seq up                                   # members on 127.0.0.1:19001-19003
  juggler seq client orders --servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 --count 5
  juggler seq up --http 127.0.0.1:18001            # and the HTTP API on 18001-18003:
  curl 'http://127.0.0.1:18001/v1/next/orders?count=5'
  juggler seq up --data ./seq-data --listen 127.0.0.1:29001
"""

#: the file in the data folder that records which addresses its cluster was made with
LAYOUT_FILE = "cluster.json"
MEMBERS = 3


def default_data_dir() -> str:
    """Where ``juggler seq up`` keeps its cluster unless told: the user's
    state folder (``$XDG_STATE_HOME``, else ``~/.local/state``), so that it
    works the same from any directory and survives a restart."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "juggler", "seq-up")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="a local 3-member cluster in one command (data in a folder it names)",
        description="Run a local three-member seq cluster: three member processes on loopback, on the port "
        "of --listen and the two after it, with their data in one folder. The first run creates the cluster; "
        "later runs in the same folder start it again, and IDs go on increasing. Ctrl-C stops it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--listen", default="127.0.0.1:19001", metavar="HOST:PORT",
                   help="the first member's gRPC address; the others take the next two ports [%(default)s]")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="also serve the HTTP/JSON API, the first member on this address and the others on the "
                        "next two ports")
    p.add_argument("--data", metavar="DIR",
                   help=f"the cluster's folder (one sub-folder per member, their logs) [{default_data_dir()}]")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="how long the members get to start and agree [%(default)s]")
    p.set_defaults(func=run)


def _addresses(listen: str, what: str) -> list[str]:
    from rustext.net import check_hostport

    addr = check_hostport(listen)
    host, _, port = addr.rpartition(":")
    first = int(port)
    if not 0 < first <= 65533:
        raise ValueError(f"{what} wants a port from 1 to 65533 (the members take it and the next two), got {port}")
    return [f"{host}:{first + i}" for i in range(MEMBERS)]


def _layout(root: str, members: list[str], http: list[str] | None) -> str:
    """'new' (an empty folder), 'restart' (this cluster's folder) or raise
    ValueError (the folder holds another cluster, or something else)."""
    path = os.path.join(root, LAYOUT_FILE)
    if not os.path.exists(path):
        if os.path.isdir(root) and any(e.startswith("node") for e in os.listdir(root)):
            raise ValueError(f"{root} holds member folders but no {LAYOUT_FILE}: not a folder of `juggler seq up`; "
                             "name another one with --data")
        return "new"
    try:
        with open(path) as f:
            recorded = json.load(f)
        old = list(recorded["members"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is unreadable ({exc}); remove the folder to start afresh") from exc
    if old != members:
        raise ValueError(f"the cluster in {root} was made on {','.join(old)}: start it with --listen {old[0]}, "
                         "or name another folder with --data (or remove this one to start afresh)")
    return "restart"


class _Up:
    """The running cluster (see cli.lifecycle.Service)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def draining(self) -> str:
        return "stopping the members (answers in flight are sent first)"

    async def start(self) -> None:
        """Started by `_serve` already."""

    async def drain(self, timeout: float | None = None) -> None:
        """SIGTERM to every member (each answers what it received first), SIGKILL after `timeout` s (5)."""
        import asyncio

        await asyncio.to_thread(self.cluster.close, 5.0 if timeout is None else timeout)

    async def aclose(self) -> None:
        await self.drain()

    def abort(self) -> None:
        """SIGKILL to every member now."""
        for m in self.cluster.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.kill()

    async def __aenter__(self) -> _Up:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def run(args: argparse.Namespace) -> int:
    from seq.localcluster import LocalCluster

    prog = "juggler seq up"
    root = os.path.abspath(os.path.expanduser(args.data or default_data_dir()))
    try:
        members = _addresses(args.listen, "--listen")
        http = _addresses(args.http, "--http") if args.http else None
        mode = _layout(root, members, http)
        if args.timeout <= 0:
            raise ValueError("--timeout must be > 0")
        os.makedirs(root, exist_ok=True)
    except (ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    cluster = LocalCluster.on(members, root=root, http=http)
    again = " ".join(["juggler seq up", *(["--listen", args.listen] if members[0] != "127.0.0.1:19001" else []),
                      *(["--data", root] if args.data else [])])
    return int(_run(_serve(prog, cluster, mode, args.timeout, members, http, again)))


def _run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


async def _serve(prog: str, cluster: Any, mode: str, timeout: float, members: list[str],
                 http: list[str] | None, again: str) -> int:
    import asyncio
    import signal

    from cli.lifecycle import StartError, say, serve

    async def start() -> _Up:
        busy = cluster.busy_ports()
        if busy:
            raise StartError(f"cannot listen on {busy}: address already in use (another `juggler seq up`? "
                             "name other ports with --listen)", status=2)
        flags = {i: ("--bootstrap",) if mode == "new" else () for i in range(cluster.n)}
        if mode == "restart":  # a member whose folder is gone catches up from the others before it votes
            flags.update({i: ("--rejoin",) for i, m in enumerate(cluster.members) if not os.path.isdir(m.data)})
        for i in range(cluster.n):
            cluster.start(i, *flags[i])
        try:
            await cluster.wait_ready(timeout=timeout)
        except (TimeoutError, RuntimeError) as exc:
            await asyncio.to_thread(cluster.close)
            raise StartError(f"the members did not start: {exc}") from exc
        if mode == "new":
            with open(os.path.join(cluster.root, LAYOUT_FILE), "w") as f:
                json.dump({"members": members, "http": http}, f)
        return _Up(cluster)

    def ready(up: _Up) -> None:
        servers = ",".join(members)
        how = "created" if mode == "new" else "started again (IDs go on from where they were)"
        lines = [
            f"seq is up: a 3-member cluster {how} on {servers}",
            f"Data and logs in {cluster.root} (node0..node2, node0.log..node2.log)",
            "Draw IDs from another terminal:",
            f"  juggler seq client orders --servers {servers} --count 5",
        ]
        if http:
            lines.append(f"  curl 'http://{http[0]}/v1/next/orders?count=5'")
        lines.append(f"Ctrl-C stops it; `{again}` starts the same cluster again.")
        print("\n".join(lines), flush=True)

    async def watch(up: _Up) -> int:
        """Report members that die (a pidfd per member: no polling); end
        (status 1) once a majority is gone."""
        loop = asyncio.get_running_loop()
        exited: asyncio.Queue[int] = asyncio.Queue()
        fds: dict[int, int] = {}
        for i, m in enumerate(up.cluster.members):
            assert m.proc is not None
            fds[i] = os.pidfd_open(m.proc.pid)
            loop.add_reader(fds[i], exited.put_nowait, i)
        gone = 0
        try:
            while True:
                i = await exited.get()
                loop.remove_reader(fds[i])
                m = up.cluster.members[i]
                assert m.proc is not None
                status = await asyncio.to_thread(m.proc.wait)
                gone += 1
                tail = "\n".join("  " + line for line in up.cluster.output(i).splitlines()[-5:])
                how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
                say(prog, f"member {m.addr} {how}; the last lines of {m.log_path}:\n{tail}")
                if gone > up.cluster.n // 2:
                    say(prog, "a majority of the members is gone: the cluster cannot serve; stopping")
                    return 1
        finally:
            for fd in fds.values():
                loop.remove_reader(fd)
                os.close(fd)

    return await serve(prog, start, ready=ready, wait=watch)
