"""What the data plane can hold, the configuration checks itself, with the
file and line: durations (finite, at most a year), counts (within the data
plane's 32 or 64 bits), rates, header values and names as its HTTP library
takes them, tables that must be tables. Every configuration accepted here is
one the data plane takes (see the fuzz tests); these are the edges."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rustext
from balancer.config import BackendConfig, BalancerConfigError, Limits, from_dict, load
from balancer.policies import Sticky
from balancer.routing import Hsts, Redirect

L = 'listen = "127.0.0.1:1"\nbackends = ["127.0.0.1:5"]\n'
ROUTE = '[[routes]]\npath = "/a"\nbackend = "default"\n'

# (name, file, line, words the message must contain)
BAD = [
    ("an infinite duration", L + "[timeouts]\nidle = inf\n", 4, ["timeouts.idle", "one year"]),
    ("a duration past a year", L + "[timeouts]\nconnect = 1e12\n", 4, ["timeouts.connect", "one year"]),
    ("a tunnel timeout that is not a number", L + "[timeouts]\ntunnel = nan\n", 4, ["timeouts.tunnel"]),
    ("a cooldown past a year", L + "[passive]\ncooldown = 4e7\n", 4, ["passive.cooldown", "one year"]),
    ("an idle pool timeout", L + "[limits]\npool_idle_timeout = inf\n", 4, ["limits.pool_idle_timeout"]),
    ("failures past 32 bits", L + "[passive]\neject_after = 4294967296\n", 4,
     ["passive.eject_after", "4294967295"]),
    ("a rate over one request per nanosecond", L + '[rate_limit]\nrate = "2000000000/s"\n', 4,
     ["rate_limit.rate", "nanosecond"]),
    ("a control character in a header value", L + '[request_headers]\nset = { X-A = "a\\u0001b" }\n', 4,
     ["request_headers.set.X-A", "control characters"]),
    ("a template without its end", L + '[response_headers]\nadd = { X-A = "from %[src" }\n', 4,
     ["response_headers.add.X-A", "%["]),
    ("a method in other letters", L + '[[routes]]\nmethod = "PÖST"\nbackend = "default"\n', 4,
     ["routes[0].method", "PÖST"]),
    ("a host name too long", L + f'[[routes]]\nhost = "{"a" * 300}"\nbackend = "default"\n', 4,
     ["routes[0].host"]),
    ("a backend given as user@host", 'listen = "127.0.0.1:1"\nbackends = ["user@app:80"]\n', 2,
     ["backend address", "host:port"]),
    ("a hash key header that is no header name", L + 'hash_key = "header:X User"\n', 3, ["hash_key"]),
    ("a route's rate limit that is no table", L + ROUTE + "rate_limit = []\n", 6,
     ["routes[0].rate_limit", "must be a table"]),
    ("a listener's request id that is no table", 'backends = ["127.0.0.1:5"]\n[[listeners]]\n'
     'address = "127.0.0.1:1"\nrequest_id = "X-Id"\n', 4, ["listeners[0].request_id", "must be a table"]),
]


@pytest.mark.parametrize(("name", "text", "line", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_values_are_refused_naming_file_line_and_key(tmp_path: Path, name: str, text: str, line: int,
                                                         words: list[str]) -> None:
    path = tmp_path / "lb.toml"
    path.write_text(text)
    with pytest.raises(BalancerConfigError) as e:
        load(path)
    message = str(e.value)
    assert message.startswith(f"{path}:{line}: "), message
    for w in words:
        assert w in message, (w, message)


def test_a_pool_without_a_name(tmp_path: Path) -> None:
    path = tmp_path / "lb.toml"
    path.write_text('listen = "127.0.0.1:1"\n[backends.""]\nservers = ["127.0.0.1:5"]\n')
    with pytest.raises(BalancerConfigError, match=re.escape(f"{path}: a backend pool needs a name")):
        load(path)


def test_two_pages_for_one_status(tmp_path: Path) -> None:
    page = tmp_path / "503.html"
    page.write_text("busy")
    path = tmp_path / "lb.toml"
    path.write_text(L + f'[error_pages]\n503 = "{page}"\n"0503" = "{page}"\n')
    with pytest.raises(BalancerConfigError, match=re.escape(f"{path}:5: error_pages.0503: a second page for 503")):
        load(path)


def test_counts_past_64_bits_from_python() -> None:
    """What no TOML integer reaches, the Python API can: refused the same way."""
    for make, words in (
        (lambda: BackendConfig(address="127.0.0.1:1", max_connections=2**64), "max_connections"),
        (lambda: Limits(max_open_connections=2**64), "limits.max_open_connections"),
        (lambda: Limits(max_header_bytes=2**64), "limits.max_header_bytes"),
        (lambda: Limits(pool_max_idle=1.5), "limits.pool_max_idle"),  # type: ignore[arg-type]
        (lambda: Hsts(max_age=2**64), "hsts.max_age"),
        (lambda: Sticky(max_age=2**64), "sticky.max_age"),
        (lambda: Redirect(scheme="https", port=True), "redirect.port"),
    ):
        with pytest.raises(BalancerConfigError, match=re.escape(words)):
            make()


def test_the_largest_values_are_taken_by_the_data_plane() -> None:
    cfg = from_dict({
        "listen": "127.0.0.1:0", "backends": [{"address": "127.0.0.1:1", "max_connections": 2**63 - 1}],
        "timeouts": {"idle": 365 * 86_400, "tunnel": 365 * 86_400}, "passive": {"eject_after": 2**32 - 1},
        "limits": {"max_open_connections": 2**63 - 1, "pool_idle_timeout": 365 * 86_400},
        "rate_limit": {"rate": "1000000000/s"},
        "request_headers": {"set": {"X-A": "tab\there, é and %[src]"}},
    })
    rustext.Balancer(cfg)  # checked, not started


def test_a_positive_duration_under_a_nanosecond_is_refused_not_made_zero() -> None:
    """The data plane counts nanoseconds: 1e-38 s would become 0 there, which
    for a connect timeout is refused and for others means "none"."""
    with pytest.raises(BalancerConfigError, match="at least a nanosecond"):
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "timeouts": {"connect": 1.175494351e-38}})
    cfg = from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "timeouts": {"connect": 1e-9}})
    rustext.Balancer(cfg)  # taken as it is: checked, not started
