"""The command line as a new user meets it: a typo gets the usage of the
command it was made in, and every help text reads as plain English."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cli.main import build_parser


def juggler(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["up", "--listn", "127.0.0.1:9000"], "usage: juggler up ", "(did you mean --listen?)"),
        (["server", "--redis-clustr", "x"], "usage: juggler server ", "(did you mean --redis-cluster?)"),
        (["rpc", "call", "127.0.0.1:1", "A.B", "--timout", "1"], "usage: juggler rpc call ", "--timeout?"),
        (["seq", "member", "list", "--servers", "127.0.0.1:1", "--jsn"], "usage: juggler seq member list ",
         "--json?"),
        (["seq", "up", "--dat", "x"], "usage: juggler seq up ", "--data?"),
        (["tls", "dev-cert", "--out", "x", "--zzz"], "usage: juggler tls dev-cert ", ""),
    ],
)
def test_a_typo_shows_the_usage_of_its_own_command(argv: list[str], usage: str, hint: str) -> None:
    done = juggler(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    prog = usage.removeprefix("usage: ").strip()
    assert f"{prog}: error: unrecognized arguments:" in done.stderr
    assert hint in done.stderr
    assert "Traceback" not in done.stderr


def test_every_log_level_flag_takes_only_a_level() -> None:
    flags = [p for p in _parsers() if any("--log-level" in a.option_strings for a in p._actions)]
    assert len(flags) >= 5, [p.prog for p in flags]
    for parser in flags:
        argv = parser.prog.removeprefix("juggler ").split()
        done = juggler(*argv, "--log-level", "INFOO")
        assert done.returncode == 2, (parser.prog, done.stderr)
        assert f"{parser.prog}: error: argument --log-level: invalid log_level value: 'INFOO'" in done.stderr
        assert "Traceback" not in done.stderr


def _parsers() -> Iterator[argparse.ArgumentParser]:
    def walk(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    yield from walk(sub)

    return walk(build_parser())


def test_help_texts_are_plain_english() -> None:
    seen = 0
    for parser in _parsers():
        text = parser.format_help()
        seen += 1
        assert "``" not in text, f"{parser.prog}: reStructuredText markup in --help"
        assert not re.search(r"\b(RRSeq|SimpleBufSeq)\b", text), f"{parser.prog}: class names in --help"
        # an example continued on the next line shows its backslash, never a run of spaces
        for line in text.splitlines():
            assert not re.search(r"\S {4,}--[a-z]", line), f"{parser.prog}: a joined example line: {line!r}"
        assert parser.description or parser.prog == "juggler", f"{parser.prog} has no description"
    assert seen > 20


def test_the_top_level_help_names_every_seq_subcommand() -> None:
    text = " ".join(juggler("--help").stdout.split())  # the help of a command may wrap
    line = re.search(r" seq (.*?) tls ", text).group(1)
    seq = next(p for p in _parsers() if p.prog == "juggler seq")
    subcommands = next(a for a in seq._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in subcommands:
        assert name in line, f"`juggler --help` does not name `seq {name}`: {line}"
