"""A few seconds of benches/overload/overload.py per product (a real subprocess).

The figures are measured by hand (the benchmark pages); here only what must
hold on any machine: at ten times the capacity some of the load is refused,
nothing times out or fails otherwise, and once the load is back to half the
capacity nothing sent is refused any more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("product", ["juggler", "rpc", "balancer", "seq"])
def test_a_short_overload(product: str, tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    res = subprocess.run(
        [sys.executable, "benches/overload/overload.py", "--product", product, "--calm", "1", "--overload", "2",
         "--after", "5", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=220, check=False,
    )
    assert out.exists(), f"the run wrote no results:\n{res.stdout}\n{res.stderr[-3000:]}"
    result = json.loads(out.read_text())["results"][0]
    s = result["summary"]
    assert s["timeouts"] == 0 and s["errors"] == 0, f"{s}\n{result['last_error']}"
    assert all(result["alive_at_end"].values()), result["alive_at_end"]
    assert s["overload"]["refused_per_s"] > 0 and s["overload"]["served_per_s"] > 0, s
    # after the drop, the last seconds' requests are all served (the first may meet what the burst left)
    tail = [row for row in result["seconds"] if row["phase"] == "after"][-2:]
    assert all(row["refused"] == 0 and row["served"] > 0 for row in tail), result["seconds"]
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
