"""What every benchmark records beside its figures: the machine, its load,
the exact command, and the CPU time of the processes it measures.

The benchmark scripts put the repository root on ``sys.path`` and import this
as ``benches.common``; their raw results go to ``benches/<area>/results/``
(JSON, written by :func:`save`) and the charts of the documentation are drawn
from those files by ``benches/charts.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """CPU model, usable cores, kernel and Python: what the figures depend on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": model or platform.processor(),
        "cores": cores,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def command() -> str:
    """The command line that is running, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = sys.argv[0]
    return shlex.join(["python", shown, *sys.argv[1:]])


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def save(path: str | Path, results: dict[str, Any]) -> Path:
    """Write ``results`` with the machine, the command and the time it was
    taken; returns the path written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command(), "taken": now_utc(), "machine": machine(), **results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def round_args(clients: int, clients_help: str) -> argparse.Namespace:
    """The command line of a benchmark measured in rounds of fixed length:
    ``--clients``, ``--duration`` (whole seconds: wrk's unit), ``--rounds``, ``--out``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=clients, help=clients_help)
    ap.add_argument("--duration", type=int, default=5, help="seconds per measurement (whole: wrk's unit)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", metavar="FILE", help="write every measurement (JSON) there")
    return ap.parse_args()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 300.0) -> None:
    """Until something accepts on 127.0.0.1:`port` (a server under valgrind
    takes a while to start)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing listened on port {port} within {timeout:.0f}s")


def under_callgrind(argv: list[str], cwd: str | Path) -> subprocess.Popen[str]:
    """Start `argv` under valgrind's callgrind, counting its instructions
    (read them with :func:`instructions` once it is stopped)."""
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def instructions(proc: subprocess.Popen[str]) -> int:
    """Stop a process started by :func:`under_callgrind`: the instructions it
    executed in its whole life."""
    proc.terminate()
    err = proc.communicate(timeout=600)[1]
    found = re.search(r"Collected : (\d+)", err)
    if not found:
        raise SystemExit(f"callgrind printed no total:\n{err[-2000:]}")
    return int(found.group(1))


def compare_instructions(trees: Iterable[str], measure: Callable[[str, bool], tuple[int, int]]) -> list[dict[str, Any]]:
    """Instructions per call of each tree's server: `measure(tree, busy)`
    runs it once under callgrind, idle or answering calls, and returns its
    instructions and the calls answered; the difference over the calls
    removes start-up. Printed as each tree is done, the first the reference."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    results: list[dict[str, Any]] = []
    for tree in trees:
        tree = os.path.abspath(tree)
        idle, _ = measure(tree, False)
        busy, calls = measure(tree, True)
        per_call = (busy - idle) / calls
        results.append({"tree": tree, "idle": idle, "busy": busy, "calls": calls, "per_call": round(per_call)})
        ratio = per_call / results[0]["per_call"]
        print(f"{tree}: {per_call / 1000:.1f}k instructions per call "
              f"({calls} calls; start-up {idle / 1e9:.2f}G; {ratio:.3f}× the first)", flush=True)
    return results
