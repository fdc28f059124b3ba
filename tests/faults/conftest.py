"""Fixtures of the fault-injection tests: toxiproxy between real processes
(tests/faults/toxiproxy.py), and what a process holds (descriptors, memory)."""

from __future__ import annotations

import os

from tests.faults.toxiproxy import toxiproxy, toxiproxy_server

__all__ = ["fd_count", "rss_kib", "toxiproxy", "toxiproxy_server"]


def fd_count(pid: int) -> int:
    """Open descriptors of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid``, KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")
