"""A short soak of every server (benches/soak/soak.py as a real subprocess).

Minutes in the test command, an hour by hand (the benchmark pages): each
product under a steady mixed load must answer every operation correctly,
stay alive, and give its descriptors back once the load's connections are
closed. Memory is sampled and recorded, not asserted: a trend needs a longer
run than a test can afford.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("product", ["juggler", "rpc", "balancer", "seq"])
def test_a_short_soak(product: str, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    res = subprocess.run(
        [sys.executable, "benches/soak/soak.py", "--product", product, "--duration", "15", "--rate", "40",
         "--sample", "3", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )
    assert out.exists(), f"the soak wrote no results:\n{res.stdout}\n{res.stderr[-3000:]}"
    result = json.loads(out.read_text())["results"][0]
    errors = [s["last_error"] for s in result["samples"] if s.get("last_error")]
    assert result["errors"] == 0, f"{result['errors']} failed operations, e.g. {errors[:3]}\n{res.stdout}"
    assert all(result["alive_at_end"].values()), f"a process died: {result['alive_at_end']}\n{res.stdout}"
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert result["ops"] >= 15 * 40 * 0.9, f"the load ran short: {result['ops']} operations"
    first = result["samples"][0]
    for role, idle in result["idle_after"].items():
        assert idle.get("fds", 1 << 30) <= first[role]["fds"] + 2, (
            f"{product} {role}: {first[role]['fds']} descriptors before the load, {idle} after it closed")
