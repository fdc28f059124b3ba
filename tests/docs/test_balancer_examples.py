"""Every TOML example of the balancer's pages is a configuration the
balancer takes: valid TOML whose keys all exist. An example may be a
fragment (a `[dns]` table alone): it is completed with a listener and a
backend where it has none. Errors about files the example names (a
certificate, a log directory) are the machine's, not the example's; an
unknown key, a wrong type or a bad value is the example's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from balancer import BalancerConfigError
from balancer.config import from_dict

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["balancer.md", "balancer-migration.md", "tls.md", "getting-started.md", "operations.md"]
BLOCK = re.compile(r"^( *)```toml\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
#: errors that come from the files an example names on a machine without them
MACHINE = re.compile(r"no such (file|directory)|not writable|cannot create a file|cannot read|does not resolve|"
                     r"password file|token file|users_file|no certificate|PEM")


def examples() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        path = DOCS / page
        if not path.exists():
            continue
        text = path.read_text()
        for m in BLOCK.finditer(text):
            indent = len(m.group(1))
            body = "\n".join(line[indent:] for line in m.group(2).splitlines())
            line = text[: m.start()].count("\n") + 1
            out.append((f"{page}:{line}", body))
    return out


def completed(doc: dict) -> dict:
    doc = dict(doc)
    if "listen" not in doc and "listeners" not in doc:
        doc["listen"] = "127.0.0.1:0"
    if "backends" not in doc:
        doc["backends"] = ["127.0.0.1:9"]
    return doc


EXAMPLES = examples()


def test_the_pages_have_examples() -> None:
    assert len([e for e in EXAMPLES if e[0].startswith("balancer.md")]) >= 10


@pytest.mark.parametrize(("where", "body"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_each_example_is_a_configuration_the_balancer_takes(where: str, body: str) -> None:
    try:
        doc = tomllib.loads(body)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{where}: not valid TOML: {exc}")
    if not doc or any(k in doc for k in ("server", "redis", "auth", "seq", "members")):
        pytest.skip("not a balancer configuration")
    try:
        from_dict(completed(doc))
    except BalancerConfigError as exc:
        message = str(exc)
        if MACHINE.search(message):
            return
        if "..." in body and "htpasswd" in message:  # a password hash elided on purpose
            return
        # a fragment naming pools it does not define: defined elsewhere on the page
        if re.search(r"no backend named", message):
            return
        pytest.fail(f"{where}: {message}")
