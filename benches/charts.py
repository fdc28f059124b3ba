"""Draw the charts (and print the tables) of the benchmark pages from the
kept raw results.

    python benches/charts.py              # every area
    python benches/charts.py rpc seq      # some
    python benches/charts.py --tables rpc # print the page's tables instead

Reads ``benches/<area>/results/*.json`` (written by the benchmarks' ``--out``)
and writes ``docs/benchmarks/img/<area>-*.png``. Needs the ``bench`` extra
(matplotlib).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benches"
OUT = ROOT / "docs" / "benchmarks" / "img"
OURS, REFERENCE, OTHER, GREY = "#2a9d8f", "#e76f51", "#264653", "#8d99ae"
PALETTE = [OURS, REFERENCE, OTHER, "#e9c46a", GREY]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported on first use (the
    tables, which the benchmarks print too, need no matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load(area: str, name: str) -> dict[str, Any]:
    return json.loads((RESULTS / area / "results" / name).read_text())


def save(fig: Any, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    pyplot().close(fig)
    return path


def bars(ax: "Axes", labels: list[str], values: list[float], colors: list[str], fmt: str = "{:,.0f}") -> None:
    rects = ax.bar(labels, values, color=colors)
    ax.bar_label(rects, labels=[fmt.format(v) for v in values], fontsize=8)
    ax.margins(y=0.15)


def stacked(ax: "Axes", labels: list[str], parts: dict[str, list[float]], ylabel: str) -> None:
    bottom = [0.0] * len(labels)
    for (name, values), color in zip(parts.items(), PALETTE, strict=False):
        ax.bar(labels, values, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for x, total in enumerate(bottom):
        ax.annotate(f"{total:,.0f}", (x, total), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)


# --- areas -----------------------------------------------------------------------


def juggler() -> list[Path]:
    plt = pyplot()
    d = load("juggler", "load.json")
    runs = d["runs"]
    labels = [f"run {i + 1}\nload {r['loadavg_before'][0]:.1f}" for i, r in enumerate(runs)]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.8))
    bars(a, labels, [r["juggler"]["throughput"] for r in runs], [OURS] * len(runs))
    a.set_title("calls/s (20 connections, closed loop)")
    bars(b, labels, [r["juggler"]["latency_ms"]["p99"] for r in runs], [OTHER] * len(runs), "{:.2f}")
    b.set_title("p99 CALL → RES (ms)")
    names = list(runs[0]["cpu_us_per_call"])
    stacked(c, labels, {n: [r["cpu_us_per_call"][n] for r in runs] for n in names}, "µs")
    c.set_title("CPU per call, by process")
    return [save(fig, "juggler-load.png")]


def rpc() -> list[Path]:
    plt = pyplot()
    files = sorted((RESULTS / "rpc" / "results").glob("rpcx-vs-grpc-*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    peers = [m["peer"] for m in docs[0]["medians"]]
    width = 0.8 / len(docs)
    for i, d in enumerate(docs):
        med = {m["peer"]: m for m in d["medians"]}
        xs = [x + (i - (len(docs) - 1) / 2) * width for x in range(len(peers))]
        lo = [med[p]["calls_per_s"] - med[p]["calls_per_s_min"] for p in peers]
        hi = [med[p]["calls_per_s_max"] - med[p]["calls_per_s"] for p in peers]
        load0 = max(r["loadavg_before"][0] for r in d["runs"])
        rects = a.bar(xs, [med[p]["calls_per_s"] for p in peers], width, yerr=[lo, hi], capsize=3,
                      label=f"run {i + 1} (load ≤ {load0:.1f})", color=PALETTE[i])
        a.bar_label(rects, labels=[f"{med[p]['calls_per_s']:,.0f}" for p in peers], fontsize=8)
    a.set_xticks(range(len(peers)), peers)
    a.set_yscale("log")
    a.set_title("calls/s, median of the rounds [min–max]")
    a.legend(fontsize=8)
    d = docs[-1]
    med = {m["peer"]: m for m in d["medians"]}
    stacked(b, peers, {"client": [med[p]["client_cpu_us_per_call"] for p in peers],
                       "server": [med[p]["server_cpu_us_per_call"] for p in peers]}, "µs")
    b.set_title(f"CPU per call (run {len(docs)})")
    fig.suptitle("Hello.Say, 581-byte protobuf, C=100, the same 2 client processes × 5 connections for every peer",
                 fontsize=10)
    return [save(fig, "rpc-rpcx-grpc.png")]


def transport() -> list[Path]:
    plt = pyplot()
    d = load("transport", "table.json")
    rows = d["medians"]
    labels = [f"{r['payload'] // 1024 if r['payload'] < 1 << 20 else r['payload'] >> 20}"
              f"{'K' if r['payload'] < 1 << 20 else 'M'}\n×{r['inflight']}" for r in rows]
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    xs = range(len(rows))
    a.bar([x - 0.2 for x in xs], [r["transport"]["mbps"] for r in rows], 0.4, label="transport (rpcx)", color=OURS)
    a.bar([x + 0.2 for x in xs], [r["raw"]["mbps"] for r in rows], 0.4, label="raw socket echo", color=GREY)
    a.set_ylabel("MB/s (payload, one way)")
    a.set_title("echo over one connection: payload × requests in flight (medians)")
    a.legend(fontsize=8)
    b.bar([x - 0.2 for x in xs], [r["transport"]["cpu_us_per_req"] for r in rows], 0.4, label="transport", color=OURS)
    b.bar([x + 0.2 for x in xs], [r["raw"]["cpu_us_per_req"] for r in rows], 0.4, label="raw", color=GREY)
    b.set_yscale("log")
    b.set_ylabel("CPU µs / request (both sides)")
    b.set_xticks(list(xs), labels, fontsize=8)
    b.legend(fontsize=8)
    return [save(fig, "transport-table.png")]


BALANCERS = ["ours", "haproxy", "nginx"]
BALANCER_COLORS = {"ours": OURS, "haproxy": REFERENCE, "nginx": OTHER}


def balancer() -> list[Path]:
    plt = pyplot()
    rows = load("balancer", "run.json")["medians"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    files = []
    for tool in ("wrk", "ab"):
        fig, axes = plt.subplots(2, len(scenarios), figsize=(4.2 * len(scenarios), 7.0))
        for j, sc in enumerate(scenarios):
            rs = [r for r in rows if r["scenario"] == sc and r["tool"] == tool]
            bars(axes[0][j], [r["balancer"] for r in rs], [r["rps"] for r in rs],
                 [BALANCER_COLORS[r["balancer"]] for r in rs])
            axes[0][j].set_title(f"{sc}: requests/s")
            for r in rs:
                axes[1][j].plot(["p50", "p90", "p99"], [r["p50_ms"], r["p90_ms"], r["p99_ms"]], marker="o",
                                label=r["balancer"], color=BALANCER_COLORS[r["balancer"]])
            axes[1][j].set_title(f"{sc}: latency (ms)")
            axes[1][j].legend(fontsize=8)
        rounds = load("balancer", "run.json")["setup"]["rounds"]
        fig.suptitle(f"{tool} ({'keep-alive' if tool == 'wrk' else 'HTTP/1.0, a connection per request'}), "
                     f"one thread each, medians of {rounds} rounds")
        files.append(save(fig, f"balancer-{tool}.png"))
    fig, ax = plt.subplots(figsize=(10, 3.8))
    labels = [f"{sc}\n{tool}" for sc in scenarios for tool in ("wrk", "ab")]
    for i, kind in enumerate(BALANCERS):
        vals = [next((r["cpu_us_per_req"] for r in rows if r["scenario"] == sc and r["tool"] == tool
                      and r["balancer"] == kind), 0) for sc in scenarios for tool in ("wrk", "ab")]
        ax.bar([x + (i - 1) * 0.27 for x in range(len(labels))], vals, 0.27, label=kind, color=BALANCER_COLORS[kind])
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("balancer CPU µs / request")
    ax.legend(fontsize=8)
    files.append(save(fig, "balancer-cpu.png"))
    return files


def seq() -> list[Path]:
    plt = pyplot()
    rounds = load("seq", "buf0.json")["rounds"]
    labels = [f"{i + 1}\nload {r['loadavg_before'][0]:.1f}" for i, r in enumerate(rounds)]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.8))
    bars(a, labels, [r["ids_per_s"] for r in rounds], [OURS] * len(rounds))
    a.set_title("IDs/s (buffer 0, 32 clients)")
    bars(b, labels, [r["p99_ms"] for r in rounds], [OTHER] * len(rounds), "{:.1f}")
    b.set_title("p99 of one next() (ms)")
    parts = {"client": [r["client_cpu_us_per_id"] for r in rounds]}
    for k in range(len(rounds[0]["servers_cpu_us_per_id"])):
        parts[f"server {k + 1}"] = [r["servers_cpu_us_per_id"][k] for r in rounds]
    stacked(c, labels, parts, "µs")
    c.set_title("CPU per ID, by process")
    files = [save(fig, "seq-buf0.png")]
    bench = load("seq", "bench_seq.json")
    cells: dict[tuple[str, int, int], float] = {}
    for b_ in bench["benchmarks"]:
        p = b_["params"]
        cells[(p["impl"], p["buf"], p["clients"])] = b_["extra_info"]["ns_per_id"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    keys = sorted({(buf, clients) for _, buf, clients in cells})
    xs = range(len(keys))
    for i, (impl, name, color) in enumerate((("simple", "SimpleBufSeq", GREY), ("rr", "RRSeq (3 members)", OURS))):
        ax.bar([x + (i - 0.5) * 0.4 for x in xs], [cells.get((impl, *k), 0) for k in keys], 0.4, label=name,
               color=color)
    ax.set_yscale("log")
    ax.set_ylabel("ns per ID (wall clock)")
    ax.set_xticks(list(xs), [f"buffer {b_}\n{c_} client{'s' if c_ > 1 else ''}" for b_, c_ in keys], fontsize=8)
    ax.legend(fontsize=8)
    files.append(save(fig, "seq-ns-per-id.png"))
    http_api = RESULTS / "seq" / "results" / "http_api.json"
    if http_api.exists():
        files.append(seq_http(json.loads(http_api.read_text())["results"]))
    return files


def seq_http(rows: list[dict[str, Any]]) -> Path:
    """gRPC against HTTP, one call per range: medians over the rounds."""
    plt = pyplot()
    keys = [(api, count) for count in (1, 1000) for api in ("grpc", "http")]

    def med(api: str, count: int, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["api"] == api and r["count"] == count)

    labels = [f"{'gRPC' if api == 'grpc' else 'HTTP'}\ncount {count}" for api, count in keys]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    bars(a, labels, [med(*k, "requests_per_s") for k in keys],
         [OTHER if api == "grpc" else OURS for api, _ in keys])
    a.set_title("ranges/s (one call each; IDs/s = × count)")
    stacked(b, labels, {"load generator": [med(*k, "loadgen_cpu_us_per_request") for k in keys],
                        "3 members": [med(*k, "servers_cpu_us_per_request") for k in keys]}, "µs")
    b.set_title("CPU per call")
    return save(fig, "seq-http.png")


# --- tables ---------------------------------------------------------------------


def rpc_table(medians: list[dict[str, Any]]) -> str:
    """The medians of one bench_rpcx run, one row per peer."""
    out = ["| peer | calls/s median [min – max] | p50 ms | p99 ms | client CPU µs/call | server CPU µs/call |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in medians:
        out.append(f"| {m['peer']} | {m['calls_per_s']:,.0f} [{m['calls_per_s_min']:,.0f} – "
                   f"{m['calls_per_s_max']:,.0f}] | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                   f"{m['client_cpu_us_per_call']:.1f} | {m['server_cpu_us_per_call']:.1f} |")
    return "\n".join(out)


def transport_table(rows: list[dict[str, Any]]) -> str:
    """The medians of run_table, one row per payload × requests in flight."""
    out = ["| payload | in flight | req/s | MB/s | p50 / p99 ms | CPU µs/req | raw req/s | raw p50 / p99 ms "
           "| raw CPU µs/req | transport ÷ raw |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        t, raw = r["transport"], r["raw"]
        size = f"{r['payload'] // 1024} KiB" if r["payload"] < 1 << 20 else f"{r['payload'] >> 20} MiB"
        out.append(f"| {size} | {r['inflight']} | {t['rps']:,.0f} | {t['mbps']:,.0f} "
                   f"| {t['p50_ms']:.2f} / {t['p99_ms']:.2f} | {t['cpu_us_per_req']:,.1f} | {raw['rps']:,.0f} "
                   f"| {raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} | {raw['cpu_us_per_req']:,.1f} | {r['ratio']:.0%} |")
    return "\n".join(out)


def balancer_table(rows: list[dict[str, Any]]) -> str:
    """The medians of one bench_balancer run, one row per scenario, tool and balancer."""
    out = ["| scenario | tool | balancer | req/s | p50 ms | p99 ms | CPU µs/req (min–max) | failures | peak RSS MiB |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['scenario']} | {r['tool']} | {r['balancer']} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | "
                   f"{r['p99_ms']:.2f} | {r['cpu_us_per_req']:.1f} ({r['cpu_min']:.1f}–{r['cpu_max']:.1f}) | "
                   f"{r['failures']} | {r['rss_mib']:.1f} |")
    return "\n".join(out)


def _load_range(runs: list[dict[str, Any]], key: str = "loadavg_before") -> str:
    values = [r[key][0] for r in runs if key in r]
    return f"{min(values):.1f}–{max(values):.1f}" if values else "?"


def juggler_tables() -> str:
    d = load("juggler", "load.json")
    out = ["| run | calls/s | median ms | p99 ms | max ms | CPU µs/call: server · callee · redis · load tool | load |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, r in enumerate(d["runs"], 1):
        j, cpu = r["juggler"], r["cpu_us_per_call"]
        out.append(f"| {i} | {j['throughput']:,.0f} | {j['latency_ms']['median']:.2f} | {j['latency_ms']['p99']:.2f} "
                   f"| {j['latency_ms']['max']:.2f} | {cpu['server']} · {cpu['callees']} · {cpu['redis']} · "
                   f"{cpu['load tool']} | {r['loadavg_before'][0]:.1f} |")
    out += ["", "| redis-benchmark, same runs, -c 20 | req/s (per run) | p99 ms (per run) |", "| --- | ---: | ---: |"]
    for name in d["runs"][0]["redis_reference"]:
        refs = [r["redis_reference"][name] for r in d["runs"]]
        rps = " / ".join(f"{x['rps']:,.0f}" for x in refs)
        p99 = " / ".join(f"{x['p99_ms']:.2f}" for x in refs)
        out.append(f"| {name} | {rps} | {p99} |")
    s = load("juggler", "scale.json")
    out += ["", "| setting | calls/s | median ms | p99 ms | CPU µs/call | NACK / expired |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for key, name in (("single", "1 server, 1 Redis"), ("cluster_2_servers", "2 servers, 3-master Redis Cluster")):
        r = s[key]
        out.append(f"| {name} | {r['calls_per_s']:,} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} "
                   f"| {r['cpu_us_per_call']} | {r['nacks']} / {r['expired']} |")
    i = s["idle"]
    out.append(f"\nidle: {i['connections']:,} connections, RSS {i['rss_before_mib']} → {i['rss_after_mib']} MiB, "
               f"{i['rss_per_1000_idle_mib']} MiB per 1,000; load {s['loadavg_before'][0]}–{s['loadavg_after'][0]}")
    return "\n".join(out)


def rpc_tables() -> str:
    out = []
    for f in sorted((RESULTS / "rpc" / "results").glob("rpcx-vs-grpc-*.json")):
        d = json.loads(f.read_text())
        out += [f"{f.name}: {d['taken']}, load {_load_range(d['runs'])}", rpc_table(d["medians"])]
        med = {m["peer"]: m for m in d["medians"]}
        cpu = {p: med[p]["client_cpu_us_per_call"] + med[p]["server_cpu_us_per_call"] for p in med}
        out.append(f"rpcx ÷ grpc.aio: {med['rpcx']['calls_per_s'] / med['grpc.aio']['calls_per_s']:.1f}× the calls/s "
                   f"at {cpu['grpc.aio'] / cpu['rpcx']:.1f}× less CPU per call\n")
    d = load("rpc", "dispatch.json")
    out += [f"dispatch: load {d['loadavg_before'][0]}–{d['loadavg_after'][0]}",
            "| case | requests/s | CPU µs per request |", "| --- | ---: | ---: |"]
    for name, r in d["cases"].items():
        out.append(f"| {name} | {r['req_per_s']:,} | {r['cpu_us_per_req']:.2f} |")
    return "\n".join(out)


def transport_tables() -> str:
    d = load("transport", "table.json")
    out = [f"load {_load_range(d['cells'], 'loadavg')}", transport_table(d["medians"])]
    c = load("transport", "codec.json")
    out += ["", "| micro-benchmark | median |", "| --- | ---: |"]
    for b in c["benchmarks"]:
        out.append(f"| {b['name']} | {b['stats']['median'] * 1e9:,.0f} ns |")
    return "\n".join(out)


def balancer_tables() -> str:
    runs = load("balancer", "run.json")["runs"]
    out = [balancer_table(load("balancer", "run.json")["medians"])]
    out += ["", "| scenario | tool | req/s ours ÷ HAProxy | CPU/req ours ÷ HAProxy | p99 ours ÷ HAProxy | failures (ours) |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for sc in dict.fromkeys(r["scenario"] for r in runs):
        for tool in ("wrk", "ab"):
            def med(kind: str, key: str, sc: str = sc, tool: str = tool) -> float:
                return statistics.median(r[key] for r in runs
                                         if r["scenario"] == sc and r["tool"] == tool and r["balancer"] == kind)
            fails = sum(r["failures"] for r in runs if r["scenario"] == sc and r["tool"] == tool and r["balancer"] == "ours")
            out.append(f"| {sc} | {tool} | {med('ours', 'rps') / med('haproxy', 'rps'):.2f} | "
                       f"{med('ours', 'cpu_us_per_req') / med('haproxy', 'cpu_us_per_req'):.2f} | "
                       f"{med('ours', 'p99_ms') / med('haproxy', 'p99_ms'):.2f} | {fails} |")
    return "\n".join(out)


def seq_tables() -> str:
    rounds = load("seq", "buf0.json")["rounds"]
    out = ["| round | IDs/s | p50 ms | p99 ms | CPU µs/ID: client + servers | load |",
           "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, r in enumerate(rounds, 1):
        srv = sum(r["servers_cpu_us_per_id"])
        out.append(f"| {i} | {r['ids_per_s']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                   f"{r['client_cpu_us_per_id']:.0f} + {srv:.0f} = {r['client_cpu_us_per_id'] + srv:.0f} "
                   f"| {r['loadavg_before'][0]:.1f} |")
    bench = load("seq", "bench_seq.json")
    out += ["", "| implementation | buffer | clients | ns/ID | IDs/s | p50 / p99 ms | CPU µs/ID: client + servers | load |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for b in sorted(bench["benchmarks"], key=lambda b: (b["params"]["impl"] != "simple", b["params"]["buf"],
                                                          b["params"]["clients"])):
        p, e = b["params"], b["extra_info"]
        name = "SimpleBufSeq" if p["impl"] == "simple" else "RRSeq"
        lat = f"{e['p50_ms']:.3f} / {e['p99_ms']:.{3 if e['p99_ms'] < 1 else 2}f}" if "p50_ms" in e else "–"
        cpu = f"{e['cli_cpu_us']:.3g}" + (f" + {e['srv_cpu_us']:.3g}" if p["impl"] == "rr" else "")
        out.append(f"| {name} | {p['buf']} | {p['clients']} | {e['ns_per_id']:,.0f} | {e['ids_per_s']:,.0f} | {lat} "
                   f"| {cpu} | {e['loadavg'][0]:.1f} |")
    return "\n".join(out)


TABLES: dict[str, Callable[[], str]] = {
    "juggler": juggler_tables, "rpc": rpc_tables, "transport": transport_tables, "balancer": balancer_tables,
    "seq": seq_tables,
}

AREAS: dict[str, Callable[[], list[Path]]] = {
    "juggler": juggler, "rpc": rpc, "transport": transport, "balancer": balancer, "seq": seq,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", action="store_true", help="print the pages' tables instead of drawing")
    ap.add_argument("areas", nargs="*", metavar="AREA", help=f"areas to draw: {', '.join(AREAS)} (default: all)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.areas) - set(AREAS))
    if unknown:
        ap.error(f"unknown area(s): {', '.join(unknown)}")
    for area in args.areas or AREAS:
        if args.tables:
            print(f"## {area}\n\n{TABLES[area]()}\n")
            continue
        for path in AREAS[area]():
            print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
