"""`juggler seq up`: a local three-member cluster in one command, run as a
user runs it (a real subprocess, its members real processes)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.clitools import Lines, cli

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def three_free_ports() -> int:
    """A port p with p, p+1 and p+2 free on 127.0.0.1 right now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base > 65530:
            continue
        socks = []
        try:
            for p in range(base, base + 3):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no three consecutive free ports")


class SeqUp:
    """`juggler seq up ARGS` with its output read line by line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.out = Lines(self.proc)

    def stop(self) -> int:
        """Ctrl-C (SIGINT) once; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.out.drain()
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        return code


def client(command: str, count: int) -> list[int]:
    words = command.split()
    assert words[:3] == ["juggler", "seq", "client"], command
    words = [w for w in words[1:] if w]
    i = words.index("--count")
    words[i + 1] = str(count)
    done = subprocess.run(cli(*words), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [int(x) for x in done.stdout.split()]


def readme_tour() -> tuple[str, str]:
    """The seq tour of the README: (the `juggler seq up` line, the client line)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(juggler seq up.*?)```", text, re.S)
    assert block, "the README's seq tour is gone"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    up = [line for line in lines if line.startswith("juggler seq up")]
    draw = [line for line in lines if line.startswith("juggler seq client")]
    assert len(up) == 1 and len(draw) == 1, lines
    return up[0], draw[0]


def test_the_readme_seq_tour_works_as_written(tmp_path: Path) -> None:
    up_line, client_line = readme_tour()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}  # where a user's data would go
    up = SeqUp(cli(*up_line.split()[1:]), env=env)
    try:
        up.out.until(r"^seq is up: a 3-member cluster created on 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003")
        data = up.out.until(r"^Data and logs in (\S+) ").group(1)
        assert data == str(tmp_path / "state" / "juggler" / "seq-up")
        printed = up.out.until(r"^  (juggler seq client .*)$").group(1)
        assert "--servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003" in printed
        first = client(client_line, 5)
        assert first == [1, 2, 3, 4, 5]
    finally:
        assert up.stop() == 0
    assert "stopping the members" in "\n".join(up.out.seen)
    again = SeqUp(cli(*up_line.split()[1:]), env=env)
    try:
        again.out.until(r"^seq is up: a 3-member cluster started again")
        later = client(client_line, 3)
        assert later[0] > first[-1] and later == sorted(set(later))  # IDs go on increasing
    finally:
        assert again.stop() == 0


def test_a_member_that_dies_is_reported_and_the_others_serve(tmp_path: Path) -> None:
    base = three_free_ports()
    up = SeqUp(cli("seq", "up", "--listen", f"127.0.0.1:{base}", "--data", str(tmp_path / "c")))
    try:
        command = up.out.until(r"^  (juggler seq client .*)$").group(1)
        assert client(command, 2) == [1, 2]
        victim = f"127.0.0.1:{base + 1}"
        pids = subprocess.run(["pgrep", "-f", "--", f"--listen {victim} "], capture_output=True, text=True,
                              timeout=10).stdout.split()
        assert len(pids) == 1, pids
        os.kill(int(pids[0]), signal.SIGKILL)
        line = up.out.until(r"member \S+ was killed by SIGKILL").string
        assert victim in line and "node1.log" in line
        assert client(command, 2)[0] > 2  # two of three members: still a quorum
    finally:
        assert up.stop() == 0


def test_wrong_starts_are_one_line_and_status_2(tmp_path: Path) -> None:
    base = three_free_ports()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 2))
        busy.listen()
        done = subprocess.run(cli("seq", "up", "--listen", f"127.0.0.1:{base}", "--data", str(tmp_path / "d")),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{base + 2}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr
    # a folder made for other ports
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "cluster.json").write_text('{"members": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]}')
    other = subprocess.run(cli("seq", "up", "--listen", f"127.0.0.1:{base}", "--data", str(tmp_path / "e")),
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 2
    assert "was made on 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3: start it with --listen 127.0.0.1:1" in other.stderr
    bad = subprocess.run(cli("seq", "up", "--listen", "127.0.0.1:65535"), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "65533" in bad.stderr
