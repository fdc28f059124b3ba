"""seq's configuration files (``juggler seq server --config``, ``juggler
seq snowflake --config``): every mistake is named with the file and the
line, flags override the file, and a real 3-member cluster started from
files serves IDs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from seq.configfile import ConfigFile, build
from seq.localcluster import LocalCluster, free_port
from seq.startup import ServerConfig
from seq.worker import WorkerConfig

GOOD = 'listen = "127.0.0.1:19101"\ndata_dir = "/tmp/seq-a"\npeers = ["127.0.0.1:19102", "127.0.0.1:19103"]\n'


def member(path: Path, flags: dict | None = None) -> ServerConfig:
    file = ConfigFile(str(path), ServerConfig, flag_only={"mode": "--bootstrap, --rejoin or --join"},
                      extra={"metrics_port": int})
    return build(ServerConfig, flags or {}, file, probe={"listen": "127.0.0.1:1", "data_dir": "."},
                 names={"listen": "--listen", "data_dir": "--data"})


@pytest.mark.parametrize(("extra", "message"), [
    ('peer_timeout = "fast"', "seq.toml:5: peer_timeout: expected a number, got 'fast'"),
    ("peer_timeout = -1", "seq.toml:5: peer_timeout must be > 0"),
    ("peer_timeot = 2", "seq.toml:5: unknown setting 'peer_timeot' (did you mean 'peer_timeout'?)"),
    ('mode = "bootstrap"', "seq.toml:5: mode is chosen on the command line only (--bootstrap, --rejoin or --join)"),
    ('http = "nohost"', "seq.toml:5: address must be HOST:PORT, got 'nohost'"),
    ("max_inflight = true", "seq.toml:5: max_inflight: expected an integer, got True"),
    ("forward = 1", "seq.toml:5: forward: expected true or false, got 1"),
    ("[server]\nx = 1", "seq.toml:5: unknown table 'server'"),
    ("peer_timeout = ", "seq.toml:5: invalid TOML"),
])
def test_a_mistake_names_the_file_and_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               extra: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("seq.toml").write_text("# member a\n" + GOOD + extra + "\n")
    with pytest.raises(ValueError) as exc:
        member(Path("seq.toml"))
    assert str(exc.value).startswith(message), str(exc.value)


def test_peers_must_be_a_list_of_addresses(tmp_path: Path) -> None:
    f = tmp_path / "seq.toml"
    f.write_text('listen = "127.0.0.1:19101"\ndata_dir = "d"\npeers = "127.0.0.1:19102"\n')
    with pytest.raises(ValueError, match=r"seq.toml:3: peers: expected a list of strings"):
        member(f)
    f.write_text('listen = "127.0.0.1:19101"\ndata_dir = "d"\npeers = ["127.0.0.1:19101"]\n')
    with pytest.raises(ValueError, match=r"--peers lists the other members only"):
        member(f)


def test_flags_override_the_file_and_fill_what_it_lacks(tmp_path: Path) -> None:
    f = tmp_path / "seq.toml"
    f.write_text(GOOD + "peer_timeout = 3\nhttp = \"127.0.0.1:18001\"\n")
    c = member(f, {"http": "127.0.0.1:18009", "mode": "bootstrap"})
    assert (c.http, c.peer_timeout, c.mode, c.peers) == ("127.0.0.1:18009", 3.0, "bootstrap",
                                                         ("127.0.0.1:19102", "127.0.0.1:19103"))
    # a bad value in the file that a flag replaces is not an error
    f.write_text(GOOD + 'http = "nohost"\n')
    assert member(f, {"http": "127.0.0.1:18009"}).http == "127.0.0.1:18009"
    f.write_text("peer_timeout = 2\n")
    with pytest.raises(ValueError, match=r"missing --listen \(or listen = … in --config FILE\), --data"):
        member(f)
    assert member(f, {"listen": "127.0.0.1:19101", "data_dir": "d"}).peer_timeout == 2.0


def test_the_snowflake_worker_reads_its_layout_from_the_file(tmp_path: Path) -> None:
    f = tmp_path / "worker.toml"
    f.write_text('cluster = ["127.0.0.1:19101"]\nlisten = "127.0.0.1:19201"\nbits = [40, 11, 12]\n')
    file = ConfigFile(str(f), WorkerConfig, flag_only={"test_clock": "--test-clock-control"})
    w = build(WorkerConfig, {}, file, probe={"cluster": ("127.0.0.1:1",), "listen": "127.0.0.1:2"}, names={})
    assert w.bits == (40, 11, 12) and w.layout.worker_bits == 11
    f.write_text('cluster = ["127.0.0.1:19101"]\nlisten = "127.0.0.1:19201"\nbits = [40, 11]\n')
    with pytest.raises(ValueError, match=r"worker.toml:3: bits: expected \[TIME, WORKER, SEQUENCE\]"):
        ConfigFile(str(f), WorkerConfig)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "cli", "seq", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_commands_say_where_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(GOOD + "peer_timeot = 2\n")
    done = run_cli("server", "--config", "a.toml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == ("juggler seq server: a.toml:4: unknown setting 'peer_timeot' "
                                   "(did you mean 'peer_timeout'?)")
    (tmp_path / "w.toml").write_text('cluster = ["127.0.0.1:19101"]\nlisten = "127.0.0.1:19201"\ntimeout = 0\n')
    done = run_cli("snowflake", "--config", "w.toml", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("juggler seq snowflake: w.toml:3: "), done.stderr
    done = run_cli("server", "--config", "missing.toml", cwd=tmp_path)
    assert done.returncode == 2 and "cannot read missing.toml" in done.stderr


async def test_a_cluster_started_from_files_serves_ids(tmp_path: Path) -> None:
    c = LocalCluster(3, root=str(tmp_path), http=True)
    try:
        wrong_http = f"127.0.0.1:{free_port()}"
        for i, m in enumerate(c.members):
            peers = ", ".join(f'"{a}"' for j, a in enumerate(c.addrs) if j != i)
            # member 0's file names another HTTP address: its --http flag wins
            http = wrong_http if i == 0 else m.http_addr
            path = tmp_path / f"m{i}.toml"
            path.write_text(f'listen = "{m.addr}"\ndata_dir = "{m.data}"\npeers = [{peers}]\nhttp = "{http}"\n'
                            f'peer_port = {m.peer_port}\nlog_level = "WARNING"\n')
            flags = ["--http", str(m.http_addr)] if i == 0 else []
            with open(m.log_path, "ab") as log:
                m.proc = subprocess.Popen([sys.executable, "-P", "-m", "cli", "seq", "server", "--config", str(path),
                                           "--bootstrap", *flags], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        await c.wait_ready(timeout=60)

        def next_ids(url: str) -> dict:
            with urllib.request.urlopen(f"{url}/v1/next/files?count=5", timeout=20) as r:
                return json.loads(r.read())

        got = [await asyncio.to_thread(next_ids, url) for url in c.http_urls]
        ranges = [(int(g["from"]), int(g["to"])) for g in got]
        # three disjoint ranges of five, each after the one before
        assert all(b - a == 4 for a, b in ranges) and all(x[1] < y[0] for x, y in zip(ranges, ranges[1:])), got
    finally:
        c.close()


@pytest.mark.parametrize("cls", [ServerConfig, WorkerConfig])
def test_every_setting_of_the_reference_can_be_written_in_a_file(cls: type) -> None:
    """A field whose type the reader does not know would be refused as an
    unknown setting although the configuration reference lists it."""
    import dataclasses

    from seq.configfile import _READERS

    keys = [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal") and f.name != "mode"]
    assert keys and all(str(f.type) in _READERS for f in keys), [(f.name, f.type) for f in keys
                                                                 if str(f.type) not in _READERS]
