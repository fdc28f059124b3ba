"""The Go client (clients/go) against a real three-member cluster.

`go test` runs the client's own tests with ``SEQ_SERVERS`` naming the
members and ``SEQ_KILL_PID`` one member's process, which a test kills with
SIGKILL while it draws. Afterwards the cluster, down to two members, must
still hand out IDs above every one the Go client got.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from seq.client import RRSeq
from seq.localcluster import LocalCluster
from tests.seq.conftest import start_cluster

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        why = f"{name} is not installed: the {name} client of seq cannot be tested"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{why} (in CI every client is tested)")
        pytest.skip(why)
    return path


def _run(cmd: list[str], cwd: Path, cluster: LocalCluster, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEQ_SERVERS": ",".join(cluster.addrs), "SEQ_KILL_PID": str(cluster.members[2].proc.pid)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_go_client(tmp_path_factory: pytest.TempPathFactory) -> None:
    go = _tool("go")
    cluster = start_cluster(tmp_path_factory)
    try:
        res = _run([go, "test", "-count=1", "-v", "./..."], ROOT / "clients" / "go", cluster, timeout=600)
        assert res.returncode == 0, f"go test failed:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}"
        for name in ("TestDrawsAreUniqueAndIncreasing", "TestMemberKilledWhileDrawing", "TestFailsOverPastADeadMember"):
            assert f"--- PASS: {name}" in res.stdout, f"{name} did not run:\n{res.stdout[-3000:]}"
        assert not cluster.members[2].alive, "the Go test was to kill the third member"
        # the two members left go on above what the Go client was handed
        asyncio.run(_draw_after(cluster))
        # the example program builds and draws
        ex = _run([go, "run", "./examples/draw", "-servers", ",".join(cluster.addrs[:2]), "-name", "go-example",
                   "-count", "3"], ROOT / "clients" / "go", cluster, timeout=300)
        assert ex.returncode == 0, ex.stderr
        ids = [int(line) for line in ex.stdout.split()]
        assert len(ids) == 3 and ids == sorted(set(ids)), ex.stdout
    finally:
        cluster.close()


async def _draw_after(cluster: LocalCluster) -> None:
    async with RRSeq("go-kill", 0, cluster.addrs, timeout=20) as s:
        first = await s.next()
    # the Go test drew 6 × 400 + 2 × 50 IDs of "go-kill" with buffers of 20: at least that many were taken
    assert first > 2500, f"the cluster handed out {first} after the Go client's draws"


def test_java_client(tmp_path_factory: pytest.TempPathFactory) -> None:
    mvn = _tool("mvn")
    cluster = start_cluster(tmp_path_factory)
    java = ROOT / "clients" / "java"
    try:
        res = _run([mvn, "-B", "-q", "-Dstyle.color=never", "test"], java, cluster, timeout=900)
        assert res.returncode == 0, f"mvn test failed:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}"
        reports = "".join(p.read_text() for p in (java / "target" / "surefire-reports").glob("*.txt"))
        assert "Tests run: 7, Failures: 0, Errors: 0, Skipped: 0" in reports, reports
        assert not cluster.members[2].alive, "the Java test was to kill the third member"
        ex = _run([mvn, "-B", "-q", "-Dstyle.color=never", "exec:java",
                   f"-Dexec.args={','.join(cluster.addrs[:2])} java-example 3"], java, cluster, timeout=300)
        assert ex.returncode == 0, ex.stdout + ex.stderr
        ids = [int(n) for n in re.findall(r"^(?:\x1b\[[0-9;]*m)*(\d+)\s*$", ex.stdout, re.M)]  # Maven colours some lines
        assert len(ids) == 3 and ids == sorted(set(ids)), ex.stdout
    finally:
        cluster.close()
