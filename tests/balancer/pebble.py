"""Pebble, Let's Encrypt's ACME test server, as the CA of the ACME tests.

Built once from its Go module by ``scripts/install-pebble`` (skipped when Go
is missing, failed under CI). Its validation authority connects to the
balancer's ports (``http_port`` for HTTP-01, ``tls_port`` for TLS-ALPN-01)
at the addresses a dnsmasq of the test gives for the test names. Readiness
is Pebble's own log line, never a sleep. Certificates live ``validity``
seconds (short ones for the renewal tests).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import urllib.request

import pytest

from tests.netutil import LogLines, wait_for_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = os.path.join(ROOT, "scripts", "install-pebble")


def pebble_binary() -> str:
    if shutil.which("go") is None and not os.path.exists(os.path.join(ROOT, "build", "pebble")):
        if os.environ.get("CI"):
            pytest.fail("Go is needed to build Pebble (scripts/install-pebble)")
        pytest.skip("Go is needed to build Pebble (scripts/install-pebble)")
    out = subprocess.run([INSTALL], check=False, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.fail(f"scripts/install-pebble failed: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


class Pebble:
    """``Pebble(workdir, http_port=..., tls_port=..., dns="127.0.0.1:53")``; ``stop()``."""

    def __init__(self, workdir: str, *, http_port: int, tls_port: int, dns: str, validity: int = 7776000,
                 port: int, management_port: int) -> None:
        exe = pebble_binary()
        certs = os.path.join(os.path.dirname(exe), "certs")
        self.minica = os.path.join(certs, "pebble.minica.pem")
        self.port, self.management_port = port, management_port
        config = {"pebble": {
            "listenAddress": f"127.0.0.1:{port}",
            "managementListenAddress": f"127.0.0.1:{management_port}",
            "certificate": os.path.join(certs, "localhost", "cert.pem"),
            "privateKey": os.path.join(certs, "localhost", "key.pem"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": False,
            "retryAfter": {"authz": 1, "order": 1},
            "keyAlgorithm": "ecdsa",
            "profiles": {"default": {"description": "test", "validityPeriod": validity}},
        }}
        path = os.path.join(workdir, f"pebble-{port}.json")
        with open(path, "w") as f:
            json.dump(config, f)
        env = {**os.environ, "PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0", "PEBBLE_AUTHZREUSE": "0"}
        self.proc = subprocess.Popen([exe, "-config", path, "-dnsserver", dns], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        self._log = LogLines(self.proc.stdout, "pebble")
        self.log = self._log.log
        self.wait_log("ACME directory available at", 30)
        # logged just before each listener binds
        wait_for_port(port, 10, self.proc)
        wait_for_port(management_port, 10, self.proc)

    @property
    def directory(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    def wait_log(self, needle: str, timeout: float = 10.0) -> str:
        return self._log.wait(needle, timeout)

    def root(self, dest: str) -> str:
        """Pebble's issuing root (it changes with each run) written to ``dest``."""
        ctx = ssl.create_default_context(cafile=self.minica)
        url = f"https://127.0.0.1:{self.management_port}/roots/0"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            data = r.read()
        with open(dest, "wb") as f:
            f.write(data)
        return dest

    def orders(self) -> int:
        """Orders Pebble has received (from its log)."""
        return sum(1 for line in self.log if "POST /order-plz" in line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
