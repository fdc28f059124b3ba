"""Fixtures: real backend processes and a real proxy in front of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from balancer_helpers import BackendProc, lb_config, start_backend

import rustext


@pytest.fixture
def backends() -> Iterator[Callable[[int], list[BackendProc]]]:
    """``backends(n)`` starts n backend processes (b0..), stopped after the test."""
    started: list[BackendProc] = []

    def make(n: int) -> list[BackendProc]:
        out = [start_backend(f"b{len(started) + i}") for i in range(n)]
        started.extend(out)
        return out

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def proxy() -> Iterator[Callable[..., rustext.Balancer]]:
    """``proxy(backends, **settings)`` starts a rustext.Balancer on a free port
    (``settings``: keys and tables of the balancer's file, see ``lb_config``)."""
    started: list[rustext.Balancer] = []

    def make(bks: list[BackendProc] | list[str], **settings: object) -> rustext.Balancer:
        b = rustext.Balancer(lb_config(bks, **settings))
        b.start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.close()




@pytest.fixture(scope="module")
def proxy_session() -> Iterator[rustext.Balancer]:
    """One backend and one proxy shared by a module (for property tests)."""
    b = start_backend("b0")
    lb = rustext.Balancer(lb_config([b], workers=1, timeouts={"header": 2}))
    lb.start()
    yield lb
    lb.close()
    b.kill()
