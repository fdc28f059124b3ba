"""The ACME parts without a CA: the renewal rule, the folder (modes, the
lock between processes), the TLS-ALPN-01 certificate, the ``[acme]`` table's
errors with file and line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from cryptography import x509

from balancer.acme.challenges import ACME_IDENTIFIER, tls_alpn_certificate
from balancer.acme.renewal import due_at
from balancer.acme.settings import Acme
from balancer.acme.storage import CertInfo, Storage
from balancer.config import load
from balancer.errors import BalancerConfigError

pytestmark = [pytest.mark.timeout(30)]


def test_renewal_is_due_with_a_third_of_the_lifetime_left():
    info = CertInfo(not_before=1000.0, not_after=1900.0, names=frozenset({"a.test"}), placeholder=False)
    assert due_at(info, ("a.test",), ("fraction", 1 / 3)) == pytest.approx(1600.0)
    assert due_at(info, ("a.test",), ("before", 100.0)) == 1800.0
    # nothing stored, the placeholder, or a name missing: at once
    assert due_at(None, ("a.test",), ("fraction", 1 / 3)) == 0.0
    assert due_at(CertInfo(1000.0, 1900.0, frozenset({"a.test"}), True), ("a.test",), ("fraction", 0.5)) == 0.0
    assert due_at(info, ("a.test", "b.test"), ("fraction", 1 / 3)) == 0.0


def test_the_folder_is_0700_its_files_0600_and_the_placeholder_is_kept(tmp_path):
    path = tmp_path / "acme"
    store = Storage(path)
    store.account_key()
    store.ensure_placeholder(("a.test",))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for name in ("account.key", "cert.pem", "key.pem"):
        assert stat.S_IMODE(os.stat(path / name).st_mode) == 0o600, name
    info = store.certificate()
    assert info is not None and info.placeholder and info.names == {"a.test"}
    before = store.read("cert.pem")
    store.ensure_placeholder(("a.test",))  # a stored pair is never replaced by a placeholder
    assert store.read("cert.pem") == before
    assert Storage(path).account_key().private_numbers() == store.account_key().private_numbers()


def test_one_process_at_a_time_holds_the_ordering_lock(tmp_path):
    a, b = Storage(tmp_path), Storage(tmp_path)
    assert a.try_lock()
    assert not b.try_lock() and not a.try_lock()
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lock")], check=False, capture_output=True, text=True, timeout=20)
    assert other.returncode != 0 and "BlockingIOError" in other.stderr  # another process is refused
    a.unlock()
    assert b.try_lock()
    b.unlock()


def test_the_tls_alpn_certificate_carries_the_critical_acme_identifier():
    cert_pem, _ = tls_alpn_certificate("a.test", "tok.thumb")
    cert = x509.load_pem_x509_certificate(cert_pem)
    ext = cert.extensions.get_extension_for_oid(ACME_IDENTIFIER)
    assert ext.critical and len(ext.value.value) == 34 and ext.value.value[:2] == b"\x04\x20"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["a.test"]


@pytest.mark.parametrize(("line", "expected"), [
    ('names = ["*.a.test"]', 'acme.names'),
    ('challenges = ["dns-01"]', 'acme.challenges'),
    ('renew_before = "3/2"', 'acme.renew_before'),
    ('renew_before = "soon"', 'acme.renew_before'),
    ('directory = "ftp://x"', 'acme.directory'),
])
def test_acme_table_errors_name_the_file_and_line(tmp_path, line, expected):
    key = line.split(" =")[0]
    base = {"names": 'names = ["a.test"]', "storage": f'storage = "{tmp_path / "s"}"'}
    base[key] = line
    text = ('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:9"]\n\n[acme]\n' + "\n".join(base.values()) + "\n")
    f = tmp_path / "lb.toml"
    f.write_text(text)
    with pytest.raises(BalancerConfigError) as exc:
        load(f)
    lineno = text.splitlines().index(line) + 1
    assert str(exc.value).startswith(f"{f}:{lineno}: {expected}"), str(exc.value)


def test_acme_gives_the_listener_its_certificate(tmp_path):
    acme = Acme(names=("A.test.",), storage=str(tmp_path))
    assert acme.names == ("a.test",) and acme.renewal() == ("fraction", pytest.approx(1 / 3))
    f = tmp_path / "lb.toml"
    f.write_text(f'listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:9"]\n[acme]\nnames = ["a.test"]\n'
                 f'storage = "{tmp_path}"\n')
    cfg = load(f)
    assert cfg.tls.certificates[0].cert == os.path.join(str(tmp_path), "cert.pem")
