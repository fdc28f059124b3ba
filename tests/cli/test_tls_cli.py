"""`juggler tls dev-cert`, run as a user would: a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rustext.tls import ServerTls


def juggler(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_dev_cert_writes_a_usable_ca_and_certificate(tmp_path: Path) -> None:
    done = juggler("tls", "dev-cert", "--out", "certs", "--name", "app.test", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    certs = tmp_path / "certs"
    assert "created a CA" in done.stdout and "--tls-ca" in done.stdout
    ServerTls(cert=str(certs / "cert.pem"), key=str(certs / "key.pem")).context()
    verified = subprocess.run(["openssl", "verify", "-CAfile", "ca.pem", "cert.pem"], cwd=certs,
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", "cert.pem"], cwd=certs,
                          capture_output=True, text=True, timeout=30).stdout
    for name in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:app.test"):
        assert name in text
    again = juggler("tls", "dev-cert", "--out", "certs", cwd=tmp_path)
    assert again.returncode == 0 and "reused the CA" in again.stdout


def test_dev_cert_usage_errors_exit_2(tmp_path: Path) -> None:
    assert juggler("tls", "dev-cert", cwd=tmp_path).returncode == 2  # --out is required
    assert juggler("tls", "dev-cert", "--out", "x", "--key-type", "dsa", cwd=tmp_path).returncode == 2
    blocked = tmp_path / "file"
    blocked.write_text("")
    done = juggler("tls", "dev-cert", "--out", str(blocked), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and str(blocked) in done.stderr
