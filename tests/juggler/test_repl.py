"""The REPL: argument parsing, error handling, and `juggler client` driven
through a pipe as a real subprocess against `juggler up`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest
from jugglerprocs import ROOT, juggler, juggler_up

from tests.netutil import free_port
from juggler.repl import Repl, ReplError, parse_args_json, parse_duration

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("100ms", 0.1), ("1m30s", 90.0), ("1.5s", 1.5), ("250us", 0.00025), ("2h", 7200.0), ("0s", 0.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5", "s", "5x", "5s junk", "-1s", "1s2"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ReplError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ('"500"', '"500"'),  # a JSON string stays a string (the original sent "\"500\"")
        ("500", "500"),
        ('{"a": [1, 2]}', '{"a": [1, 2]}'),
        ("`{\"raw\": true}`", '{"raw": true}'),  # backticks: raw JSON
        ('"héllo"', '"héllo"'),
        ("null", "null"),
    ],
)
def test_parse_args_json(typed: str, sent: str) -> None:
    assert parse_args_json(typed) == sent
    json.loads(sent)


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("hello world", 'a string needs quotes: "hello world"'),  # a typo is never sent as a string
        ("{not json", "ARGS is not JSON"),
        ("`{not json`", "ARGS is not JSON"),
        ("NaN", "ARGS is not JSON"),  # a Python extension, not JSON
        ('"unterminated', "ARGS is not JSON"),
    ],
)
def test_parse_args_json_refuses_what_is_not_json(typed: str, says: str) -> None:
    with pytest.raises(ReplError, match="nothing sent") as info:
        parse_args_json(typed)
    assert says in str(info.value)


async def test_errors_are_printed_and_the_session_goes_on() -> None:
    out: list[str] = []
    repl = Repl(out.append, wait_outcomes=True)
    assert await repl.execute("frobnicate 1") is True
    assert await repl.execute("call 2 test.delay 5s \"20\"") is True
    assert await repl.execute("disconnect 2") is True
    assert await repl.execute("call") is True
    assert await repl.execute(f"connect ws://127.0.0.1:{free_port()}/ws") is True
    assert await repl.execute("") is True
    assert await repl.execute("# a comment") is True
    assert await repl.execute("help") is True
    assert await repl.execute("exit") is False
    errors = [line for line in out if line.startswith("(error) ")]
    assert errors[0].startswith("(error) unknown command")
    assert errors[1] == "(error) invalid connection ID: 2"
    assert errors[2] == "(error) invalid connection ID: 2"
    assert errors[3].startswith("(error) usage: call ID URI")
    assert errors[4].startswith("(error) dial failed")
    assert any("call ID URI [TIMEOUT [ARGS]]" in line for line in out)
    await repl.aclose()


@pytest.fixture(scope="module")
def up_url() -> Iterator[str]:
    with juggler_up() as url:
        yield url


def run_client(script: str, timeout: float = 60, status: int = 0) -> str:
    res = subprocess.run(juggler("client"), input=script, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert res.returncode == status, res.stdout + res.stderr
    return res.stdout + res.stderr


def test_repl_through_a_pipe(up_url: str) -> None:
    out = run_client(
        f"connect {up_url}\n"
        'call 1 test.echo 5s "hello"\n'
        'call 1 test.reverse "héllo"\n'  # no TIMEOUT: the default
        'call 1 test.delay 5s "20"\n'  # a JSON string of ms: works (the original sent "\\"20\\"")
        "call 1 test.delay 100ms `\"1000\"`\n"  # expires locally: a failed command
        f"connect {up_url}\n"
        "sub 1 news\n"
        "psub 1 new*\n"
        'pub 2 news {"x": 1}\n'
        "wait 1\n"
        "wait 1\n"
        "unsb 1 news\n"
        "punsb 1 new*\n"
        "call 3 test.echo\n"
        "exit\n",
        status=1,  # the expired call and the bad connection ID
    )
    lines = out.splitlines()
    assert f"[1] connected to {up_url} (juggler.0)" in lines
    assert any(re.match(r'\[1\] <<< RES  message: \S+ for CALL \S+ \(test\.echo\): "hello"$', ln) for ln in lines), out
    assert any(ln.endswith('(test.reverse): "olléh"') for ln in lines), out
    assert any(ln.endswith("(test.delay): 20") for ln in lines), out
    assert any("expired: nothing answered within 100ms" in ln for ln in lines), out
    evnts = [ln for ln in lines if ln.startswith("[1] <<< EVNT")]
    assert len(evnts) == 2, out
    assert any("via pattern new*" in ln for ln in evnts) and all(ln.endswith(': {"x":1}') for ln in evnts)
    assert sum(1 for ln in lines if re.match(r"\[1\] <<< ACK  message: \S+ for (SUB|UNSB) ", ln)) == 4
    assert any(re.match(r"\[2\] <<< ACK  message: \S+ for PUB \S+ \(news\)", ln) for ln in lines)
    assert "(error) invalid connection ID: 3" in lines
    assert not any("NACK" in ln for ln in lines)


def test_repl_eof_exits_and_close_and_bad_frames(up_url: str) -> None:
    out = run_client(
        f"connect {up_url}\n"
        f"connect {up_url}\n"
        "send 1 {bad\n"  # invalid JSON: the server closes connection 1 only
        "wait 1\n"
        "close 2 bye\n"
        f"connect {up_url}\n"
        "rand 3 16\n"
        "wait 3\n"
        f"connect {up_url}\n"
        "disconnect 4\n"  # no close handshake
        "list\n",
        # EOF, no exit; connections closed by the server are events, not failed commands
    )
    lines = out.splitlines()
    assert "[1] >>> 4 bytes of text" in lines
    assert any(ln.startswith("[1] connection closed") for ln in lines), out
    assert any(ln.startswith("[2] connection closed") and "1000" in ln for ln in lines), out
    assert "[3] >>> 16 random bytes (binary frame)" in lines
    assert any(ln.startswith("[3] connection closed") for ln in lines), out
    assert "[4] connection closed (no close frame)" in lines, out
    assert "no open connection" in lines


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(st.text(max_size=200))
def test_parse_args_json_always_gives_json_or_a_repl_error(text: str) -> None:
    try:
        sent = parse_args_json(text)
    except ReplError:
        return
    json.loads(sent, parse_constant=lambda name: pytest.fail(f"{name} sent"))


def test_pipe_mode_errors_go_to_stderr_and_set_the_exit_status(up_url: str) -> None:
    """A script whose commands all succeed exits 0 with nothing on stderr; a
    typo, a malformed duration or ARGS that are not JSON are refused on
    stderr, never sent, and the exit status is 1; a call to a URI no callee
    serves is refused (NACK 404) rather than left to expire."""
    ok = subprocess.run(juggler("client"), input=f'connect {up_url}\ncall 1 test.echo 5s "x"\nexit\n',
                        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    for line, says in (
        ('call 1 test.echo 5q "x"', "(error) invalid duration '5q'"),
        ("call 1 test.echo 5s hello", 'a string needs quotes: "hello"'),
        ("call 1 test.echo 5s {bad", "ARGS is not JSON"),
        ("cal 1 test.echo", "(error) unknown command 'cal'"),
    ):
        res = subprocess.run(juggler("client"), input=f"connect {up_url}\n{line}\nexit\n",
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 1, res.stdout + res.stderr
        assert says in res.stderr and "(error)" not in res.stdout, res.stderr
        assert ">>> CALL" not in res.stdout  # nothing was sent
    nack = subprocess.run(juggler("client"), input=f'connect {up_url}\ncall 1 test.nope 5s "x"\nexit\n',
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert nack.returncode == 1
    assert "404: no callee serves test.nope" in nack.stdout


@given(st.text(max_size=30))
def test_parse_duration_never_crashes(text: str) -> None:
    try:
        assert parse_duration(text) >= 0
    except ReplError:
        pass


def test_repl_shows_history_positions(redis_url: str, tmp_path: object) -> None:
    """On a channel with history, the REPL shows the SUB's position and each event's offset."""
    from pathlib import Path

    from jugglerprocs import juggler_server

    config = Path(str(tmp_path)) / "history.toml"
    config.write_text('[[channels]]\nmatch = "hist.*"\nhistory_size = 10\n')
    with juggler_server(redis_url, "--config", str(config)) as url:
        out = run_client(
            f"connect {url}\n"
            "sub 1 hist.room\n"
            "pub 1 hist.room 7\n"
            "wait 1\n"
            "exit\n",
        )
    lines = out.splitlines()
    assert any(re.match(r"\[1\] <<< ACK  message: \S+ for SUB \S+ \(hist\.room\) at offset 0 epoch \w+$", ln)
               for ln in lines), out
    assert any(re.match(r"\[1\] <<< EVNT message: \S+ for PUB \S+ on hist\.room #1: 7$", ln) for ln in lines), out


def test_repl_prints_notices() -> None:
    """Join/leave and "not recovered" notices read as such, not as events of nobody."""
    lines: list[str] = []
    repl = Repl(out=lines.append)
    repl._print_message(1, {"meta": {"type": 10, "uuid": "u"},
                            "payload": {"channel": "c", "join": {"client": "x", "user": "ann"}}})
    repl._print_message(1, {"meta": {"type": 10, "uuid": "u"},
                            "payload": {"channel": "c", "recovered": False, "offset": 3, "epoch": "e"}})
    assert lines == ['[1] <<< EVNT message: u on c: join {"client":"x","user":"ann"}',
                     "[1] <<< EVNT message: u on c: events lost, NOT recovered (now at offset 3 epoch e)"]
