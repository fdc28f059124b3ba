"""Prometheus text exposition of the data plane's stats."""

from __future__ import annotations

from typing import Any


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(stats: dict[str, Any]) -> str:
    """Render ``rustext.Balancer.stats()`` in the Prometheus text format 0.0.4."""
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            out.append(f"{name}{labels} {value}")

    metric("balancer_connections_total", "counter", "Client connections accepted.", [("", stats["connections_total"])])
    metric("balancer_connections_active", "gauge", "Client connections open.", [("", stats["connections_active"])])
    metric("balancer_requests_total", "counter", "Client requests received.", [("", stats["requests"])])
    metric(
        "balancer_responses_total", "counter", "Responses sent to clients by status class.",
        [(f'{{class="{k}"}}', v) for k, v in stats["responses"].items()],
    )
    metric("balancer_request_bytes_total", "counter", "Request body bytes from clients.", [("", stats["bytes_in"])])
    metric("balancer_response_bytes_total", "counter", "Response body bytes to clients.", [("", stats["bytes_out"])])
    metric("balancer_retries_total", "counter", "Requests retried on another backend.", [("", stats["retries"])])
    metric("balancer_no_backend_total", "counter", "Requests answered 503 (no backend).", [("", stats["no_backend"])])
    metric("balancer_backend_errors_total", "counter", "Requests answered 502.", [("", stats["backend_errors"])])
    metric("balancer_timeouts_total", "counter", "Backend timeouts (504 or cut body).", [("", stats["timeouts"])])

    name = "balancer_request_duration_seconds"
    out.append(f"# HELP {name} Time to the response head, as seen by the balancer.")
    out.append(f"# TYPE {name} histogram")
    cum = 0
    for bound, n in zip([*stats["latency_bounds"], "+Inf"], stats["latency_buckets"], strict=True):
        cum += n
        out.append(f'{name}_bucket{{le="{bound}"}} {cum}')
    out.append(f"{name}_sum {stats['latency_sum']}")
    out.append(f"{name}_count {cum}")

    backends = stats.get("backends", [])
    states = ("up", "down", "drain", "ejected")
    out.append("# HELP balancer_backend_state Backend state (1 for the current one).")
    out.append("# TYPE balancer_backend_state gauge")
    for b in backends:
        for s in states:
            out.append(f'balancer_backend_state{{backend="{_esc(b["name"])}",state="{s}"}} {int(b["state"] == s)}')
    for key, kind, help_ in (
        ("weight", "gauge", "Backend weight."),
        ("active", "gauge", "Requests in flight to the backend."),
        ("requests", "counter", "Requests sent to the backend."),
        ("failures", "counter", "Transport failures (connect, reset, timeout)."),
        ("ejections", "counter", "Passive ejections."),
        ("bytes_out", "counter", "Response body bytes from the backend."),
    ):
        mname = f"balancer_backend_{key}" + ("_total" if kind == "counter" and key != "bytes_out" else "")
        if key == "bytes_out":
            mname = "balancer_backend_response_bytes_total"
        metric(mname, kind, help_, [(f'{{backend="{_esc(b["name"])}"}}', b[key]) for b in backends])
    metric(
        "balancer_backend_responses_total", "counter", "Backend responses by status class.",
        [(f'{{backend="{_esc(b["name"])}",class="{k}"}}', v) for b in backends for k, v in b["responses"].items()],
    )
    return "\n".join(out) + "\n"
