// juggler.js (with the `ws` package, which offers permessage-deflate) against
// the ORIGINAL Go juggler-server, through a real redis-server, our callee
// answering the calls. Runs when JUGGLER_GO_SERVER names a juggler-server
// binary built from the original (PuerkitoBio/juggler with mna/redisc, not on
// the Go module proxy); skipped otherwise. The client's extension asks (the
// juggler-keepalive and juggler-refresh query parameters) are ignored by the
// original, which sends nothing but juggler.0.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";

import { ConnectionLostError, Juggler } from "../../juggler/static/juggler.js";
import { PYTHON, ROOT, freePort, until, waitForPort } from "./helpers.mjs";

const GO_SERVER = process.env.JUGGLER_GO_SERVER;

/** A subprocess listening on `port`, its output kept for failures. */
async function listening(cmd, args, port) {
  const proc = spawn(cmd, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const keep = (d) => {
    output = (output + d.toString()).slice(-20000);
  };
  proc.stdout.on("data", keep);
  proc.stderr.on("data", keep);
  try {
    await waitForPort(port, { proc, timeout: 15000 });
  } catch (err) {
    proc.kill("SIGKILL");
    throw new Error(`${cmd} did not start: ${err.message}\n${output}`);
  }
  return proc;
}

async function stop(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const gone = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGTERM");
  const t = setTimeout(() => proc.kill("SIGKILL"), 10000);
  await gone;
  clearTimeout(t);
}

describe("juggler.js against the original Go server", { skip: !GO_SERVER && "JUGGLER_GO_SERVER is not set" }, () => {
  const procs = [];
  const clients = [];
  let url;

  before(async () => {
    const redisPort = await freePort();
    procs.push(await listening("redis-server", ["--port", String(redisPort), "--bind", "127.0.0.1", "--save", "",
      "--appendonly", "no"], redisPort));
    const goPort = await freePort();
    procs.push(await listening(GO_SERVER, ["-port", String(goPort), "-redis", `127.0.0.1:${redisPort}`, "-L"], goPort));
    const metrics = await freePort(); // the callee's metrics port says it is up
    procs.push(await listening(PYTHON, ["-m", "cli", "callee", "--redis", `redis://127.0.0.1:${redisPort}/0`,
      "--metrics-port", String(metrics)], metrics));
    url = `ws://127.0.0.1:${goPort}/ws`;
  });

  after(async () => {
    for (const c of clients) c.close();
    for (const p of procs.reverse()) await stop(p);
  });

  async function connect(extra = {}) {
    const c = await Juggler.connect(url, { WebSocket, initialDelay: 50, maxDelay: 500, ...extra });
    clients.push(c);
    return c;
  }

  test("calls, pub-sub and pattern subscriptions, with keepalive and refresh asked for", async () => {
    let tokens = 0;
    const c = await connect({ getToken: async () => `opaque-${++tokens}` });
    const other = await connect();
    assert.equal(c.state, "open");
    assert.equal(await c.call("test.reverse", "abc", { timeout: 5000 }), "cba");
    const got = [];
    await c.subscribe("room", (args) => got.push(["room", args])).ready;
    await c.subscribe("r.*", (args, ev) => got.push([ev.channel, args]), { pattern: true }).ready;
    await other.publish("room", { n: 1 });
    await other.publish("r.x", [1, 2]);
    await until(() => got.length === 2, { what: "both events" });
    assert.deepEqual(got.sort(), [["r.x", [1, 2]], ["room", { n: 1 }]]);
    assert.equal(tokens, 1);
    assert.equal(c.state, "open");
  });

  test("a history request, a type the original does not know, costs a reconnection, not a wait", async () => {
    const c = await connect();
    const states = [];
    c.addEventListener("statechange", (e) => states.push(e.detail.state));
    const started = Date.now();
    await assert.rejects(c.history("h.x", { timeout: 10000 }), ConnectionLostError);
    assert.ok(Date.now() - started < 5000);
    await until(() => c.state === "open" && states.includes("reconnecting"), { what: "the reconnection" });
    assert.equal(await c.call("test.echo", "after", { timeout: 5000 }), "after");
  });
});
