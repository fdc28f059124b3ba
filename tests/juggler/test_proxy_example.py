"""The FastAPI backend of docs/juggler/proxies.md (examples/fastapi_backend.py),
run by uvicorn in its own process, behind a real juggler server: every
proxy kind does what the page says. The page shows the file verbatim."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from test_proxy_server import proxied, refused

from juggler.auth import Identity
from juggler.client import connect
from juggler.errors import CallNacked
from juggler.proxy import ProxyConfig
from tests.juggler.jugglerprocs import ROOT
from tests.netutil import free_port, wait_for_port

pytestmark = pytest.mark.timeout(60)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

EXAMPLE = ROOT / "examples" / "fastapi_backend.py"
PAGE = ROOT / "docs" / "juggler" / "proxies.md"


def test_the_page_shows_the_example_verbatim() -> None:
    text = PAGE.read_text()
    assert "```python\n" + EXAMPLE.read_text() + "```" in text


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "examples.fastapi_backend:app", "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT)
    try:
        wait_for_port(port, timeout=20, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def example_configs(url: str) -> list[ProxyConfig]:
    return [
        ProxyConfig(kind="connect", endpoint=f"{url}/juggler/connect", cookies=("sessionid",)),
        ProxyConfig(kind="refresh", endpoint=f"{url}/juggler/refresh"),
        ProxyConfig(kind="subscribe", endpoint=f"{url}/juggler/subscribe", match=("chat:*",)),
        ProxyConfig(kind="publish", endpoint=f"{url}/juggler/publish", match=("chat:*",)),
        ProxyConfig(kind="rpc", endpoint=f"{url}/juggler/rpc", match=("app.*",)),
    ]


async def test_the_example_backend(app_url: str) -> None:
    async with proxied(example_configs(app_url)) as (server, proxies):
        assert (await refused(server, {}))[:2] == (401, "Unauthorized: log in first\n")
        async with connect(server.url, headers={"Authorization": "Bearer alice-token"}) as alice, \
                connect(server.url, headers={"Cookie": "sessionid=s-alice"}) as alice2, \
                connect(server.url + "?token=bob-token") as bob:
            identities = sorted((c.identity.user, c.identity.data["name"]) for c in server.conns)
            assert identities == [("alice", "Alice"), ("alice", "Alice"), ("bob", "Bob")]
            assert all(c.identity.channels == (f"user:{c.identity.user}",) for c in server.conns)
            await alice.sub("chat:admins")
            await alice2.sub("chat:lobby")
            with pytest.raises(CallNacked) as info:
                await bob.sub("chat:admins")
            assert (info.value.code, info.value.message) == (403, "not a member")
            with pytest.raises(CallNacked) as info:
                await bob.sub("chat:nowhere")
            assert info.value.code == 404
            await bob.pub("chat:lobby", {"text": "hello", "from": "someone else"})
            ev = await alice2.next_event(timeout=5)
            assert ev.args == {"from": "bob", "text": "hello"}
            with pytest.raises(CallNacked) as info:
                await bob.pub("chat:lobby", "not an object")
            assert info.value.code == 400
            assert await bob.call("app.whoami", timeout=5) == {"user": "bob"}
            assert await bob.call("app.add", [1, 2, 3.5], timeout=5) == 6.5
            assert (await bob.call("app.add", "x", timeout=5))["error"]["code"] == 400
            assert (await bob.call("app.nothing", timeout=5))["error"] == {"code": 404, "message": "no method app.nothing"}
        result = await proxies.refresh(Identity({"sub": "alice"}, None, user="alice"))
        assert not result.expired and result.expire_at is not None and result.expire_at > time.time()


