"""A real DNS server for the discovery tests (balancer, rpc): dnsmasq on a free
loopback port, answering only from a hosts file (A/AAAA, reread on SIGHUP)
and from ``--srv-host`` records (fixed for the life of the process).

Readiness and reloads are known from dnsmasq's own log lines on stderr
(``started``, ``read FILE``), never from a sleep.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess

import pytest

from tests.netutil import LogLines, free_port


class Dnsmasq:
    """``Dnsmasq(hosts_file, srv=[...])`` (records with a TTL of ``ttl`` seconds); ``set_hosts({name: [ip, ...]})``
    rewrites the file and waits until dnsmasq has reread it; ``stop()``."""

    def __init__(self, hosts_file: str, hosts: dict[str, list[str]] | None = None, *, srv: list[str] = (),
                 port: int | None = None, ttl: int = 0) -> None:
        exe = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
        if exe is None:
            if os.environ.get("CI"):
                pytest.fail("dnsmasq is not installed (scripts/test installs dnsmasq-base)")
            pytest.skip("dnsmasq is not installed (apt-get install dnsmasq-base)")
        self.hosts_file = hosts_file
        self._write(hosts or {})
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [exe, "--no-daemon", "--conf-file=/dev/null", f"--port={self.port}", "--listen-address=127.0.0.1",
             "--bind-interfaces", "--no-resolv", "--no-hosts", "--no-negcache", f"--addn-hosts={hosts_file}",
             "--pid-file=", "--log-facility=-", f"--user={getpass.getuser()}", f"--local-ttl={ttl}",
             *(f"--srv-host={s}" for s in srv)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        assert self.proc.stderr is not None
        self._log = LogLines(self.proc.stderr, "dnsmasq")
        self.log = self._log.log
        self.wait_log(f"read {hosts_file}", 20)  # read before the first query is served

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_log(self, needle: str, timeout: float = 10.0) -> str:
        """The next log line containing ``needle`` (earlier ones are consumed)."""
        return self._log.wait(needle, timeout)

    def set_hosts(self, hosts: dict[str, list[str]]) -> None:
        """Replace the hosts file and wait until dnsmasq has read it again."""
        self._write(hosts)
        self.proc.send_signal(signal.SIGHUP)
        self.wait_log(f"read {self.hosts_file}")

    def _write(self, hosts: dict[str, list[str]]) -> None:
        tmp = self.hosts_file + ".new"
        with open(tmp, "w") as f:
            for name, ips in hosts.items():
                f.writelines(f"{ip} {name}\n" for ip in ips)
        os.replace(tmp, self.hosts_file)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
