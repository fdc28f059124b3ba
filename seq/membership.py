"""Membership changes: add or remove one member at a time (``juggler seq member``).

The configuration of a cluster is its member list and an epoch (its
version, 1 at bootstrap), persisted in every member's ``meta.json`` with the
cluster id (the fingerprint of the list the cluster was bootstrapped with).
A member votes only in rounds of its own epoch: every read and
compare-and-set carries the coordinator's epoch, and a member in another
epoch answers WRONG_EPOCH (:mod:`seq.coordinator`).

A change from epoch E (members C) to E+1 (members C', C plus or minus one
member) is driven by :class:`Admin` (the CLI) in two steps:

1. **Fence** a majority of C: each member, in one step of its event loop,
   stops voting in epoch E (it accepts no further compare-and-set), records
   the change (epoch E+1, C', a token naming this change) in its meta.json
   durably, and answers with all its values. A member fenced for one change
   refuses to be fenced for another (BUSY), so at most one change per epoch
   gets a fenced majority.
2. **Install** on the members of C' (and tell a removed member): each
   merges the maximum of the fenced members' values into its store, makes it
   durable, writes epoch E+1 and C' to its meta.json, and only then votes in
   epoch E+1. A new member (started with ``--join``) is not a member, and
   counts in no quorum, until its install: it catches up from those values
   first. The change is done once a majority of C' is installed.

Why no ID is handed out twice (the rule of rrseq.md, "any two acknowledged
ranges are disjoint", across epochs):

- A range of epoch E is acknowledged after W_E = |C|/2+1 members of C, in
  epoch E and not fenced, accepted its compare-and-set. Once a majority F
  of C is fenced, no further range of epoch E can be acknowledged (W_E
  members and F would share a member, which refuses); and every range of
  epoch E acknowledged before has a yes from a member of F, given before it
  was fenced, so the merged values are at least its end.
- Every member voting in epoch E+1 merged those values before voting. A
  range of epoch E+1 needs a yes from such a member, which accepts only a
  compare-and-set from h at or above its value: every range of epoch E+1
  lies above every range acknowledged before the change, in any epoch (by
  induction: the ranges of epochs before E were below the values merged
  when E was installed).
- Within an epoch the usual argument holds (two write quorums of one
  configuration share a member).

So the two steps need a majority of the old configuration (fence) and one
of the new (install), as with joint consensus. Why single-server changes
then: (a) a change that stops halfway must stay safe and be finishable:
with C and C' differing by one member, any majority of C and any majority of
C' share a member, so a member of the old majority is always in the new
configuration and a member that missed the change learns it from the others
(it catches up from all of them, as ``--rejoin`` does); (b) an operator can
reason about one change. Two changes to the same epoch cannot both be
installed: each needs a fenced majority of C, and a member is fenced for
one change only.

What a member does with a configuration it was not installed into (it was
down, or unreachable): on a read or compare-and-set of a newer epoch (and,
while fenced, every second by itself) it asks the members it knows for their
configuration and adopts the newest; if it is
in it, it catches up from all of the other members before voting (as for
``--rejoin``); if not, it was removed: it refuses every request
(:class:`seq.errors.MemberRemoved`, gRPC FAILED_PRECONDITION) and refuses
to start again.

A change that stops halfway (the CLI killed, a majority unreachable) leaves
the fenced members not voting until it is finished: running the same command
again resumes it (the token is read back from the members). A different
change is refused while one is pending. Clients are not told about new
members: they keep using the members they were given, skip removed ones
(FAILED_PRECONDITION), and learn new ones when restarted with a new list.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import grpc

from seq.errors import ChangeRefused, MembershipError
from seq.peerlink import (
    BUSY,
    OK,
    OP_FENCE,
    OP_INFO,
    OP_INSTALL,
    REMOVED,
    STALE,
    WRONG_CLUSTER,
    PeerLink,
    PeerUnavailable,
)

#: a removal must leave at least this many members (the smallest cluster that survives losing one)
MIN_MEMBERS = 3


def fingerprint(members: Sequence[str]) -> str:
    """The id of a cluster bootstrapped with `members` (order does not matter)."""
    return hashlib.sha256(",".join(sorted(members)).encode()).hexdigest()[:16]


def majority(n: int) -> int:
    """R = W = n // 2 + 1, so R + W > n."""
    return n // 2 + 1


@dataclass(frozen=True)
class MemberView:
    """What one member said about itself (``reachable`` False: it did not answer, see ``error``)."""

    addr: str
    reachable: bool
    state: str = ""
    cluster: str = ""
    epoch: int = 0
    members: tuple[str, ...] = ()
    pending: dict[str, Any] | None = None
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"member": self.addr, "reachable": self.reachable}
        if self.reachable:
            d.update(state=self.state, epoch=self.epoch, members=list(self.members))
            if self.pending is not None:
                d["pending"] = {"epoch": self.pending["epoch"], "members": list(self.pending["members"])}
        else:
            d["error"] = self.error
        return d


@dataclass(frozen=True)
class Configuration:
    """The newest configuration the members report, and each member's view."""

    cluster: str
    epoch: int
    members: tuple[str, ...]
    views: dict[str, MemberView]

    @property
    def quorum(self) -> int:
        return majority(len(self.members))

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        """(member, change) of members of this epoch fenced for a change."""
        return [(a, v.pending) for a, v in self.views.items()
                if v.reachable and v.pending is not None and v.epoch == self.epoch]

    def to_json(self) -> dict[str, Any]:
        pend = self.pending()
        return {
            "cluster": self.cluster, "epoch": self.epoch, "members": list(self.members), "quorum": self.quorum,
            "pending": None if not pend else {"epoch": pend[0][1]["epoch"], "members": list(pend[0][1]["members"]),
                                              "fenced": sorted(a for a, _ in pend)},
            "states": [self.views[a].to_json() for a in sorted(self.views)],
        }


@dataclass(frozen=True)
class ChangeResult:
    action: str  # "add" or "remove"
    member: str
    epoch: int  # the new configuration's
    members: tuple[str, ...]
    installed: tuple[str, ...]  # members that hold the new configuration now
    missing: tuple[str, ...] = ()  # members of it that did not answer (they catch up by themselves)
    resumed: bool = False  # finished a change left pending
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "member": self.member, "epoch": self.epoch, "members": list(self.members),
                "installed": list(self.installed), "missing": list(self.missing), "resumed": self.resumed}


class Admin:
    """Reads the configuration and makes changes, talking to members over their peer port.

    ``async with Admin(timeout=5.0) as admin``; every call to a member is
    bounded by `timeout`. `tls` (a :class:`rustext.tls.ClientTls` with the
    CA and a member certificate): the cluster runs mutual TLS between members.
    """

    def __init__(self, *, timeout: float = 5.0, tls: Any = None) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.timeout = timeout
        self._tls = tls
        self._links: dict[str, tuple[grpc.aio.Channel, PeerLink]] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        links, self._links = self._links, {}
        for ch, link in links.values():
            await link.aclose()
            await ch.close()

    def _link(self, addr: str) -> PeerLink:
        got = self._links.get(addr)
        if got is None:
            from seq.wire import CHANNEL_OPTIONS, grpc_credentials

            if self._tls is None:
                ch = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
            else:
                ch = grpc.aio.secure_channel(addr, grpc_credentials(self._tls), options=CHANNEL_OPTIONS)
            got = (ch, PeerLink(addr, ch, "", tls=None if self._tls is None else self._tls.context()))
            self._links[addr] = got
        return got[1]

    async def _call(self, addr: str, req: list[Any]) -> list[Any]:
        """One call, tried again within `timeout` while the member cannot be reached (a member just
        restarted; grpc may hand a new channel a connection still backing off). Every call here is
        idempotent: a fence or install that arrives twice has the same effect as once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        delay = 0.05
        while True:
            left = deadline - loop.time()
            try:
                return await self._link(addr).call(req, max(left, 0.05))  # type: ignore[no-any-return]
            except PeerUnavailable:
                left = deadline - loop.time()
                if left < 0.1:
                    raise
                await asyncio.sleep(min(delay, left - 0.05))
                delay = min(delay * 2, 0.5)

    async def view(self, addr: str) -> MemberView:
        try:
            rep = await self._call(addr, [OP_INFO, "", ""])
        except Exception as exc:  # noqa: BLE001  # unreachable, no answer in time, not a seq member: reported
            return MemberView(addr, False, error=_reason(exc))
        if rep[0] != OK or not isinstance(rep[1], dict):
            return MemberView(addr, False, error=f"unexpected answer {rep!r}")
        i = rep[1]
        return MemberView(addr, True, state=str(i["state"]), cluster=str(i["cluster"]), epoch=int(i["epoch"]),
                          members=tuple(i["members"]), pending=i.get("pending"))

    async def configuration(self, servers: Sequence[str]) -> Configuration:
        """Ask `servers`, then every member of the newest configuration they report."""
        if not servers:
            raise ChangeRefused("no server given (--servers HOST:PORT,...)")
        views: dict[str, MemberView] = {}
        ask = list(dict.fromkeys(servers))
        while ask:
            for v in await asyncio.gather(*(self.view(a) for a in ask)):
                views[v.addr] = v
            known = [v for v in views.values() if v.reachable and v.epoch > 0]
            if not known:
                break
            best = max(known, key=lambda v: v.epoch)
            extra = [*best.members, *(best.pending["members"] if best.pending else ())]
            ask = [a for a in dict.fromkeys(extra) if a not in views]
        known = [v for v in views.values() if v.reachable and v.epoch > 0 and v.state != "joining"]
        if not known:
            why = "; ".join(f"{v.addr}: {v.error or v.state}" for v in views.values())
            raise MembershipError(f"no member of a cluster answered ({why})")
        best = max(known, key=lambda v: v.epoch)
        clusters = {v.cluster for v in known}
        if len(clusters) > 1:
            raise ChangeRefused(f"--servers names members of different clusters ({', '.join(sorted(clusters))})")
        return Configuration(cluster=best.cluster, epoch=best.epoch, members=best.members, views=views)

    async def add(self, servers: Sequence[str], new: str) -> ChangeResult:
        """Add `new` (a member started with ``--join``) to the cluster of `servers`."""
        conf = await self.configuration(servers)
        if new in conf.members:
            v = await self.view(new)
            if v.reachable and v.state == "joining":
                return await self._catch_up(conf, new)
            raise ChangeRefused(f"{new} is already a member (configuration epoch {conf.epoch})")
        v = conf.views.get(new) or await self.view(new)
        if not v.reachable:
            raise MembershipError(
                f"cannot reach {new} ({v.error}): start it first with juggler seq server --listen {new} --join "
                "--data DIR"
            )
        if v.state != "joining":
            raise ChangeRefused(
                f"{new} was not started with --join (it is {v.state.replace('_', ' ')}"
                f"{f' in configuration epoch {v.epoch}' if v.epoch else ''}): a new member starts with an empty "
                "data directory and --join"
            )
        return await self._change(conf, "add", new, tuple(sorted((*conf.members, new))))

    async def remove(self, servers: Sequence[str], old: str) -> ChangeResult:
        """Remove `old` from the cluster of `servers` (it may be down)."""
        conf = await self.configuration(servers)
        if old not in conf.members:
            raise ChangeRefused(f"{old} is not a member (configuration epoch {conf.epoch}: {','.join(conf.members)})")
        left = len(conf.members) - 1
        if left < MIN_MEMBERS:
            raise ChangeRefused(
                f"removing {old} would leave {left} member{'s' if left != 1 else ''}; at least {MIN_MEMBERS} are "
                "kept (a smaller cluster stops when one member fails): add its replacement first"
            )
        return await self._change(conf, "remove", old, tuple(m for m in conf.members if m != old))

    async def _catch_up(self, conf: Configuration, new: str) -> ChangeResult:
        """`new` is in the configuration but missed its install (the change stopped before reaching
        it): it takes the configuration and catches up from all other members before voting."""
        rep = await self._call(new, [OP_INSTALL, conf.cluster, "", "catch-up", conf.epoch, list(conf.members), None])
        if rep[0] != OK:
            raise MembershipError(f"{new} did not take configuration epoch {conf.epoch} (status {rep[0]})")
        return ChangeResult(action="add", member=new, epoch=conf.epoch, members=conf.members,
                            installed=tuple(a for a in conf.members if a != new), missing=(new,), resumed=True,
                            notes=[f"{new} catches up from all other members before it votes"])

    async def _change(self, conf: Configuration, action: str, member: str, target: tuple[str, ...]) -> ChangeResult:
        epoch = conf.epoch + 1
        token = ""
        for addr, p in conf.pending():
            if int(p["epoch"]) == epoch and tuple(p["members"]) == target:
                token = str(p["token"])
            else:
                raise MembershipError(
                    f"another membership change is in progress (fenced on {addr}): to epoch {p['epoch']} with "
                    f"members {','.join(p['members'])}. Finish it first by running the command that started it "
                    "again (juggler seq member list shows it)"
                )
        resumed = bool(token)
        token = token or secrets.token_hex(8)
        # 1. fence a majority of the current configuration
        fence = [OP_FENCE, conf.cluster, "", token, epoch, list(target)]
        replies = await asyncio.gather(*(self._call(a, fence) for a in conf.members), return_exceptions=True)
        merged: dict[str, int] = {}
        fenced, busy, stale, down = [], [], [], []
        for a, r in zip(conf.members, replies):
            if isinstance(r, BaseException):
                down.append(f"{a} ({_reason(r)})")
            elif r[0] == OK:
                fenced.append(a)
                for k, val in r[1].items():
                    if val > merged.get(k, 0):
                        merged[k] = val
            elif r[0] == BUSY:
                busy.append((a, r[1].get("pending") or {}))
            elif r[0] in (STALE, REMOVED, WRONG_CLUSTER):
                stale.append((a, r[1]))
            else:
                down.append(f"{a} (status {r[0]})")
        need = majority(len(conf.members))
        if len(fenced) < need:
            if busy:
                a, p = busy[0]
                raise MembershipError(
                    f"another membership change is in progress (fenced on {a}): to epoch {p.get('epoch')} with "
                    f"members {','.join(p.get('members', ()))}. Finish it first by running the command that "
                    "started it again"
                )
            if any(int(i.get("epoch", 0)) >= epoch for _, i in stale):
                raise MembershipError("the configuration changed meanwhile: run juggler seq member list, then "
                                      "the command again if it is still needed")
            left = ("; no member stopped voting" if not fenced else
                    f"; the change is pending on {','.join(fenced)} (not voting until it is finished)")
            raise MembershipError(
                f"only {len(fenced)} of the {len(conf.members)} members of configuration epoch {conf.epoch} could "
                f"take part (a majority, {need}, is needed); unreachable: {', '.join(down) or 'none'}"
                f"{', out of date: ' + ','.join(a for a, _ in stale) if stale else ''}{left}. Run the same "
                "command again once a majority is reachable"
            )
        # 2. install the new configuration, with every value the fenced majority holds
        install = [OP_INSTALL, conf.cluster, "", token, epoch, list(target), merged]
        told = list(dict.fromkeys((*target, *conf.members)))
        replies = await asyncio.gather(*(self._call(a, install) for a in told), return_exceptions=True)
        installed = tuple(a for a, r in zip(told, replies) if not isinstance(r, BaseException) and r[0] == OK
                          and a in target)
        missing = tuple(a for a in target if a not in installed)
        need = majority(len(target))
        if len(installed) < need:
            raise MembershipError(
                f"the new configuration (epoch {epoch}) reached only {len(installed)} of its {len(target)} members "
                f"(a majority, {need}, is needed; missing {','.join(missing)}): the change is pending. Run the same "
                "command again once they are reachable"
            )
        return ChangeResult(action=action, member=member, epoch=epoch, members=target, installed=installed,
                            missing=missing, resumed=resumed)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
