"""``juggler balancer --check``: the configuration read as a start would, nothing served."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.netutil import free_port


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "cli", "balancer", "--config", str(path), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_valid_file_is_reported_valid_and_nothing_listens(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "lb.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nbackends = ["127.0.0.1:9"]\n')
    res = check(cfg)
    assert res.returncode == 0, res.stderr
    assert "is valid" in res.stdout
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # --check bound nothing


def test_mistakes_name_the_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "lb.toml"
    cfg.write_text('listen = "127.0.0.1:1"\nbackends = ["127.0.0.1:9"]\n[[routes]]\n'
                   "path_regex = '(('\nbackend = \"default\"\n")
    res = check(cfg)
    assert res.returncode == 2
    assert f"{cfg}:4: routes[0].path_regex" in res.stderr
    cfg.write_text('listen = "127.0.0.1:1"\nbackends = ["127.0.0.1:9"]\n[tls]\n[[tls.certificates]]\n'
                   f'cert = "{tmp_path}/missing.pem"\nkey = "{tmp_path}/missing-key.pem"\n')
    res = check(cfg)
    assert res.returncode == 2
    assert "missing.pem" in res.stderr


def test_an_acme_configuration_is_checked_before_its_first_certificate(tmp_path: Path) -> None:
    storage = tmp_path / "acme"
    cfg = tmp_path / "lb.toml"
    cfg.write_text(f'listen = "127.0.0.1:1"\n[tls]\nredirect = "127.0.0.1:2"\n[acme]\nnames = ["example.com"]\n'
                   f'storage = "{storage}"\nemail = "ops@example.com"\n[backends.web]\nservers = ["127.0.0.1:9"]\n'
                   '[[routes]]\nbackend = "web"\n')
    res = check(cfg)
    assert res.returncode == 0, res.stderr
    assert not storage.exists(), "--check wrote into the ACME folder"
