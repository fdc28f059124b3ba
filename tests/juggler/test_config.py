"""Typed config: defaults, validation, TOML files, CLI flags on top."""

from __future__ import annotations

import argparse

import pytest

from juggler.config import AppConfig, ServerConfig, config_from_dict, load_config, parse_listen


def test_defaults_are_upstream_like() -> None:
    c = AppConfig()
    assert (c.server.host, c.server.port, c.server.path) == ("127.0.0.1", 9000, "/ws")
    assert c.server.call_timeout_ms == 60_000 and c.redis is None and c.metrics.port == 0
    # unlike the original, pings are on: a peer gone silent does not hold its connection for ever
    assert (c.server.ping_interval, c.server.pong_timeout, c.server.read_timeout) == (25.0, 10.0, 0.0)


@pytest.mark.parametrize(
    "kw",
    [{"port": 70000}, {"path": "ws"}, {"read_limit": -1}, {"write_timeout": -1.0}, {"call_timeout_ms": 0},
     {"max_pending": 0}, {"handshake_timeout": 0}, {"ping_interval": -1.0}, {"ping_interval": float("nan")},
     {"ping_interval": float("inf")}, {"pong_timeout": 0.0}, {"pong_timeout": float("nan")}],
)
def test_validation(kw: dict) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**kw)


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        ServerConfig("0.0.0.0")  # type: ignore[misc]


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    for bad in ("nope", "h:x", "h:99999"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_toml_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "j.toml"
    p.write_text(
        """
[server]
listen = "127.0.0.1:9100"
path = "/juggler"
allow_empty_subprotocol = true
read_limit = 4096
slow_threshold = 0.25
ping_interval = 0.5
pong_timeout = 2

[redis]
url = "redis://127.0.0.1:6390/1"
call_cap = 5

[metrics]
port = 9101
"""
    )
    c = load_config(str(p))
    assert (c.server.port, c.server.path, c.server.allow_empty_subprotocol) == (9100, "/juggler", True)
    assert c.server.read_limit == 4096 and c.server.slow_threshold == 0.25
    assert (c.server.ping_interval, c.server.pong_timeout) == (0.5, 2.0)
    assert c.redis.url == "redis://127.0.0.1:6390/1" and c.redis.call_cap == 5
    assert c.metrics.port == 9101


@pytest.mark.parametrize(
    "data",
    [{"server": {"bogus": 1}}, {"nope": {}}, {"server": {"port": "x"}}, {"server": []}, {"memory": {"call_cap": -1}}],
)
def test_invalid_files(data: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        config_from_dict(data)


def test_bad_toml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.toml"
    p.write_text("[server\n")
    with pytest.raises(ValueError):
        load_config(str(p))


def test_flags_override_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cli.server import build_config

    p = tmp_path / "j.toml"
    p.write_text('[server]\nlisten = "127.0.0.1:9100"\nread_limit = 10\n')
    ns = argparse.Namespace(config=str(p), listen="127.0.0.1:9200", path="/x", redis="redis://h:1/0",
                            metrics_port=9300)
    c = build_config(ns)
    assert (c.server.port, c.server.path, c.server.read_limit) == (9200, "/x", 10)
    assert c.redis.url == "redis://h:1/0" and c.metrics.port == 9300


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ('[server]\nlisten = "127.0.0.1:9000"\n# a comment\nread_limit = "abc"\n', 4,
         "server.read_limit: expected an integer, got 'abc'"),
        ('[server]\nlisten = "127.0.0.1:9000"\n\n[metrics]\nport = 70000\n', 5, "metrics port must be in 0..65535"),
        ('[server]\nport = 1\n[bogus]\nx = 1\n', 3, "unknown section(s): bogus"),
        ('[server]\nport = 1\nnope = 2\n', 3, "unknown option(s) in [server]: nope"),
        ('[redis]\nurl = "http://x"\n', 2, "unsupported Redis URL scheme"),
        ('[server]\nlisten = "nowhere"\n', 2, "listen address must be HOST:PORT"),
        ('[server\n', 1, "invalid TOML"),
        ('[server]\nport = 1\nping_interval = -5\n', 3, "ping_interval must be a number of seconds >= 0"),
        ('[server]\npong_timeout = 0\nport = 1\n', 2, "pong_timeout must be a number of seconds > 0"),
        ('[server]\nport = 1\nping_interval = "25s"\n', 3, "server.ping_interval: expected a number, got '25s'"),
    ],
)
def test_file_errors_name_the_line(tmp_path, text: str, line: int, says: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "juggler.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_config(str(path))
    assert str(info.value).startswith(f"{path}:{line}: "), str(info.value)
    assert says in str(info.value)
