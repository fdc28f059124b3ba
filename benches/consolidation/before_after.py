"""Two checkouts against each other, alternating, three rounds: the transport
echo (4 KiB, 16 in flight), the rpcx server under `juggler rpc bench` (server
CPU per call from /proc), and juggler end to end (benches/juggler/bench_load.py).

    python benches/consolidation/before_after.py BEFORE_CHECKOUT AFTER_CHECKOUT OUT.json

Each checkout needs its own .venv with the package installed (editable).
"""
import json, os, signal, socket, subprocess, sys, time
TREES = {"before": sys.argv[1], "after": sys.argv[2]}
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def cpu(pid):
    with open(f"/proc/{pid}/stat") as f: x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")
def wait(port, t=30):
    end = time.time() + t
    while time.time() < end:
        try: socket.create_connection(("127.0.0.1", port), 0.2).close(); return
        except OSError: time.sleep(0.05)
    raise TimeoutError
out = []
for rnd in range(3):
    for name in (["before", "after"] if rnd % 2 == 0 else ["after", "before"]):
        d = TREES[name]; py = f"{d}/.venv/bin/python"
        r = subprocess.run([py, "-m", "cli", "rpc", "transport-bench", "--payload", "4096", "--inflight", "16",
                            "--duration", "5", "--no-raw", "--json"], cwd=d, capture_output=True, text=True, timeout=120)
        out.append({"tree": name, "round": rnd, "bench": "transport 4KiB x16", "output": r.stdout.strip()})
        port = free_port()
        srv = subprocess.Popen([py, "-m", "cli", "rpc", "serve", "--listen", f"127.0.0.1:{port}", "--example", "bench"],
                               cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(port); time.sleep(0.3)
        c0 = cpu(srv.pid)
        r = subprocess.run([py, "-m", "cli", "rpc", "bench", f"127.0.0.1:{port}", "-c", "100", "-n", "200000",
                            "--pool", "5", "--processes", "2"], cwd=d, capture_output=True, text=True, timeout=300)
        scpu = cpu(srv.pid) - c0
        srv.send_signal(signal.SIGTERM); srv.wait(30)
        tps = [l for l in r.stdout.splitlines() if "TPS" in l or "tps" in l.lower()]
        out.append({"tree": name, "round": rnd, "bench": "rpcx -c100 -n200000 --pool 5 --processes 2",
                    "server_cpu_us_per_call": round(scpu / 200000 * 1e6, 2), "output": "\n".join(tps) or r.stdout[-600:]})
        r = subprocess.run([py, "benches/juggler/bench_load.py", "-d", "6s", "--no-reference", "--json"], cwd=d,
                           capture_output=True, text=True, timeout=300)
        try:
            j = json.loads(r.stdout)
            out.append({"tree": name, "round": rnd, "bench": "juggler bench_load -d 6s",
                        "calls_per_s": round(j["juggler"]["throughput"]), "cpu_us_per_call": j["cpu_us_per_call"]})
        except ValueError:
            out.append({"tree": name, "round": rnd, "bench": "juggler bench_load -d 6s", "error": r.stderr[-500:]})
        print(json.dumps(out[-3:]), flush=True)
json.dump({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": out}, open(sys.argv[3], "w"), indent=1)
