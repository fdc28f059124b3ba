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


def test_up_serves_wss_and_the_client_and_load_tool_verify_it(tmp_path: Path) -> None:
    from tests.netutil import free_port, wait_for_port

    certs = tmp_path / "certs"
    assert juggler("tls", "dev-cert", "--out", str(certs), cwd=tmp_path).returncode == 0
    port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "cli", "up", "--listen", f"127.0.0.1:{port}",
                           "--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_for_port(port, timeout=30, proc=up)
        url = f"wss://localhost:{port}/ws"
        script = f'connect {url}\ncall 1 test.echo 5s "over tls"\nexit\n'
        ok = subprocess.run([sys.executable, "-m", "cli", "client", "--tls-ca", str(certs / "ca.pem")],
                            input=script, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert ok.returncode == 0 and '"over tls"' in ok.stdout, ok.stderr
        refused = subprocess.run([sys.executable, "-m", "cli", "client"], input=script,
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert refused.returncode == 1 and "server certificate refused" in refused.stderr
        load = juggler("load", "--url", url, "-d", "1s", "-c", "2", "--quiet", "--tls-ca", str(certs / "ca.pem"),
                       cwd=tmp_path)
        assert load.returncode == 0 and "errors 0" in load.stdout, load.stdout + load.stderr
    finally:
        up.terminate()
        up.wait(timeout=15)


def test_unusable_certificate_files_are_one_line_and_status_2(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    done = juggler("up", "--listen", "127.0.0.1:0", "--tls-cert", "bad.pem", "--tls-key", "bad.pem", cwd=tmp_path)
    assert done.returncode == 2 and "bad.pem" in done.stderr and "Traceback" not in done.stderr
    half = juggler("server", "--listen", "127.0.0.1:0", "--tls-cert", "bad.pem", cwd=tmp_path)
    assert half.returncode == 2 and "both tls_cert and tls_key" in half.stderr
