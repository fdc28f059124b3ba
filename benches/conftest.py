"""pytest hooks of the benchmarks.

``--benchmark-json`` files are committed under ``benches/*/results/``: they
keep each benchmark's summary statistics (min, median, IQR, rounds, …) and
the machine, not every timed sample (a micro-benchmark times tens of
thousands of rounds: megabytes of numbers nothing reads).
"""

from __future__ import annotations

from typing import Any


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    for b in output_json.get("benchmarks", []):
        b.get("stats", {}).pop("data", None)
