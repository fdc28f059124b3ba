"""HTTP/2 conformance of the balancer's listeners, checked by h2spec (the
test suite of RFC 7540/9113 and RFC 7541 HPACK that HTTP/2 servers are
usually held to), built from its Go module and run against a real
rustext.Balancer in front of a real backend.

Over TLS (ALPN h2) every case must pass. A cleartext listener serves HTTP/1
and HTTP/2 on one port, telling them apart by the client's first bytes (as
HAProxy does on a plain ``bind``): bytes that are not the HTTP/2 preface are
read as HTTP/1, so h2spec's "invalid connection preface" case gets an
HTTP/1 ``400`` and a closed connection instead of a bare close. That one
case is expected; every other must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(600)]

H2SPEC = "github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible"
#: the case a listener serving HTTP/1 too answers differently (see the docstring)
PREFACE_CASE = "http2/3.5|Sends invalid connection preface"


@pytest.fixture(scope="module")
def h2spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        why = "Go is not installed: h2spec cannot be built"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{why} (the test command installs it)")
        pytest.skip(why)
    gobin = tmp_path_factory.mktemp("h2spec")
    res = subprocess.run([go, "install", H2SPEC], capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "GOBIN": str(gobin), "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"})
    assert res.returncode == 0, f"go install {H2SPEC} failed:\n{res.stderr}"
    return gobin / "h2spec"


def run_h2spec(binary: Path, port: int, report: Path, *, tls: bool) -> dict[str, str]:
    """Every case's outcome ("passed" | "failed" | "skipped") by section and title
    ("http2/6.5.3|Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE")."""
    args = [str(binary), "-h", "127.0.0.1", "-p", str(port), "-o", "5", "-j", str(report)]
    if tls:
        args += ["-t", "-k"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert report.exists(), f"h2spec wrote no report:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}"
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        outcomes[f"{case.get('package')}|{case.get('classname')}"] = outcome
    assert len(outcomes) >= 140, f"h2spec ran {len(outcomes)} cases:\n{res.stdout[-3000:]}"
    return outcomes


def failures(outcomes: dict[str, str]) -> list[str]:
    return sorted(k for k, v in outcomes.items() if v != "passed")


def test_h2spec_over_tls(proxy: Any, backends: Any, pki: TestPKI, h2spec: Path, tmp_path: Path) -> None:
    leaf = pki.leaf("localhost", "127.0.0.1")
    lb = proxy(backends(1), workers=1, tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]})
    outcomes = run_h2spec(h2spec, lb.address[1], tmp_path / "tls.xml", tls=True)
    assert failures(outcomes) == []
    assert lb.stats()["requests"] > 0  # the cases that expect an answer reached the backend


def test_h2spec_cleartext_prior_knowledge(proxy: Any, backends: Any, h2spec: Path, tmp_path: Path) -> None:
    lb = proxy(backends(1), workers=1)
    outcomes = run_h2spec(h2spec, lb.address[1], tmp_path / "h2c.xml", tls=False)
    assert [k for k in failures(outcomes) if k != PREFACE_CASE] == []
    assert lb.stats()["requests"] > 0
