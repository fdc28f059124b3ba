// The HTTP fallback of juggler.js (SSE down, POST up) through OUR balancer:
// two real `juggler up` behind `juggler balancer` (a subprocess) with sticky
// cookies and a route that refuses websocket upgrades (403 on an `Upgrade`
// header, as a corporate proxy would). The client in headless Chromium and
// in Node falls back to the fallback by itself, subscribes and calls there
// (every POST reaching the server that holds its stream: the sticky cookie),
// then, once the balancer is reloaded without the rule, goes back to the
// websocket and keeps its subscriptions. And an event stream cut on the way
// is reopened within the server's grace, without losing an event.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";
import WebSocket from "ws";

import { Juggler } from "../../juggler/static/juggler.js";
import { JugglerProc, PYTHON, ROOT, freePort, until, waitForPort } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];
const T = 15000; // ms: every wait of this file

let a, b, lb, lbPort, lbFile, browser;
const lbOutput = [];
const clients = []; // closed in after(), also when a test fails midway (their timers would keep Node alive)
const LIMIT = { timeout: 60000 }; // a test that fails by waiting for ever fails in time instead

function balancerToml(denyUpgrades) {
  const deny = denyUpgrades
    ? `
# a proxy that refuses websockets: any request with an Upgrade header gets 403
[[routes]]
header = { name = "Upgrade" }
respond = { status = 403, body = "websockets are not allowed here\\n" }
`
    : "";
  return `listen = "127.0.0.1:${lbPort}"

[health]
path = "/healthz"
interval = 1.0

# the fallback's POSTs must reach the server holding the session's stream
[sticky]
cookie = "JUGGLER_SERVER"
${deny}
[[backends]]
address = "127.0.0.1:${a.port}"

[[backends]]
address = "127.0.0.1:${b.port}"
`;
}

before(async () => {
  [a, b] = await Promise.all([JugglerProc.up(), JugglerProc.up()]);
  lbPort = await freePort();
  lbFile = path.join(mkdtempSync(path.join(os.tmpdir(), "juggler-lb-")), "balancer.toml");
  writeFileSync(lbFile, balancerToml(true));
  lb = spawn(PYTHON, ["-m", "cli", "balancer", "--config", lbFile], {
    cwd: ROOT,
    env: { ...process.env, PYTHONUNBUFFERED: "1" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  for (const s of [lb.stdout, lb.stderr]) s.on("data", (d) => lbOutput.push(d.toString()));
  await waitForPort(lbPort, { proc: lb });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true, timeout: 30000 });
});

after(async () => {
  for (const c of clients) c.close();
  if (browser) await browser.close();
  if (lb && lb.exitCode === null) {
    const gone = new Promise((r) => lb.once("exit", r));
    lb.kill("SIGTERM");
    await gone;
  }
  await Promise.all([a, b].filter(Boolean).map((p) => p.stop()));
});

/** Reload the balancer (SIGHUP) with upgrades allowed or refused; resolves once it answers accordingly. */
async function setUpgrades(allowed) {
  writeFileSync(lbFile, balancerToml(!allowed));
  lb.kill("SIGHUP");
  await until(async () => {
    const ok = await new Promise((resolve) => {
      const ws = new WebSocket(`ws://127.0.0.1:${lbPort}/ws`, ["juggler.0"]);
      ws.on("open", () => {
        ws.close();
        resolve(true);
      });
      ws.on("error", () => resolve(false));
    });
    return ok === allowed;
  }, { timeout: T, what: `the balancer reloaded (upgrades ${allowed ? "allowed" : "refused"})` });
}

/** fetch with a cookie jar: Node's fetch keeps no cookies, a browser does (the sticky cookie). */
function cookieFetch() {
  const jar = new Map();
  return async (url, init = {}) => {
    const headers = new Headers(init.headers || {});
    if (jar.size) headers.set("Cookie", [...jar].map(([k, v]) => `${k}=${v}`).join("; "));
    const res = await fetch(url, { ...init, headers });
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const i = pair.indexOf("=");
      jar.set(pair.slice(0, i).trim(), pair.slice(i + 1).trim());
    }
    return res;
  };
}

test("Chromium falls back to SSE behind a proxy refusing websockets, then goes back to the websocket", LIMIT, async () => {
  const page = await browser.newPage();
  page.setDefaultTimeout(T);
  const problems = [];
  page.on("pageerror", (err) => problems.push(`pageerror: ${err.message}`));
  page.on("console", (msg) => {
    // the browser logs the refused websocket handshakes (the proxy's 403), and the
    // favicon.ico it asks for by itself (only the demo page has one: favicon.svg)
    if (msg.type() === "error" && !/WebSocket connection to .* failed/.test(msg.text()) &&
        !msg.location().url.endsWith("/favicon.ico")) {
      problems.push(`console: ${msg.text()} (${msg.location().url})`);
    }
  });
  try {
    // the page and juggler.js come through the balancer too
    assert.equal((await page.goto(`http://127.0.0.1:${lbPort}/juggler.js`)).status(), 200);
    const url = `ws://127.0.0.1:${lbPort}/ws`;
    const first = await page.evaluate(async (url) => {
      const { Juggler } = await import("/juggler.js");
      const c = await Juggler.connect(url, { websocketRetry: 300, initialDelay: 50, maxDelay: 500 });
      window.c = c;
      window.got = [];
      window.fellBack = [];
      c.addEventListener("fallback", (ev) => window.fellBack.push(ev.detail.transport));
      const unsub = c.subscribe("fb.news", (args) => window.got.push(args));
      await unsub.ready;
      const calls = [];
      for (let i = 0; i < 8; i++) calls.push(await c.call("test.reverse", `abc${i}`, { timeout: 5000 }));
      await c.publish("fb.news", { n: 1 });
      return { transport: c.transport, state: c.state, calls, cookie: document.cookie };
    }, url);
    assert.equal(first.transport, "sse");
    assert.equal(first.state, "open");
    assert.deepEqual(first.calls, Array.from({ length: 8 }, (_, i) => `${i}cba`));
    await page.waitForFunction(() => window.got.length === 1);

    // the proxy lets websockets through again: the client goes back to the websocket by itself
    await setUpgrades(true);
    await page.waitForFunction(() => window.c.transport === "websocket" && window.c.state === "open", null,
      { timeout: T });
    const second = await page.evaluate(async () => {
      const c = window.c;
      const r = await c.call("test.echo", "over the websocket", { timeout: 5000 });
      await c.publish("fb.news", { n: 2 }); // the subscription was restored on the websocket
      return { r, transport: c.transport };
    });
    assert.deepEqual(second, { r: "over the websocket", transport: "websocket" });
    await page.waitForFunction(() => window.got.length === 2);
    assert.deepEqual(await page.evaluate(() => window.got), [{ n: 1 }, { n: 2 }]);
    assert.deepEqual(problems, []);
    await page.evaluate(() => window.c.close());

    // the demo page, through the same balancer, says which transport it is on
    await page.goto(`http://127.0.0.1:${lbPort}/`);
    await page.locator("#state.open").waitFor();
    assert.equal(await page.locator("#state").textContent(), "open");
    await setUpgrades(false);
    await page.reload();
    await page.locator("#state.open", { hasText: "open (sse)" }).waitFor();
    // leave the session (close=1): the balancer would otherwise hold the stream of a closed page
    // until its next write (a keepalive comment, every ping_interval) and its stop would wait for it
    await page.evaluate(() => window.juggler.close());
  } finally {
    await setUpgrades(false);
    await page.close();
  }
});

test("in Node, a refused websocket falls back too; only the fallback when asked", LIMIT, async () => {
  const url = `ws://127.0.0.1:${lbPort}/ws`;
  // without the cookie, the POSTs would go round robin and half of them find no session (404)
  const fetchWithCookies = cookieFetch();
  const c = await Juggler.connect(url, { WebSocket, fetch: fetchWithCookies, websocketRetry: 0, initialDelay: 50 });
  clients.push(c);
  try {
    assert.equal(c.transport, "sse");
    const got = [];
    const unsub = c.subscribe("fb.node", (args) => got.push(args));
    await unsub.ready;
    const words = Array.from({ length: 250 }, (_, i) => `w${i}`);
    // concurrent calls: the client keeps one POST in flight and batches the rest, 100 a POST at most
    const results = await Promise.all(words.map((w) => c.call("test.reverse", w, { timeout: 5000 })));
    assert.deepEqual(results, words.map((w) => [...w].reverse().join("")));
    await c.publish("fb.node", "hi");
    await until(() => got.length === 1, { timeout: T, what: "the event over SSE" });
    assert.deepEqual(got, ["hi"]);
  } finally {
    c.close();
  }
  // straight to a server, the fallback alone
  const only = await Juggler.connect(a.wsUrl, { transports: ["sse"] });
  clients.push(only);
  try {
    assert.equal(only.transport, "sse");
    assert.equal(await only.call("test.echo", "sse only", { timeout: 5000 }), "sse only");
  } finally {
    only.close();
  }
  assert.throws(() => new Juggler(a.wsUrl, { transports: ["carrier-pigeon"] }), RangeError);
});

/** A TCP proxy to 127.0.0.1:port whose connections can be cut (a proxy dropping long responses). */
async function cuttableProxy(port) {
  const socks = new Set();
  const srv = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    for (const [x, y] of [[client, upstream], [upstream, client]]) {
      socks.add(x);
      x.pipe(y);
      const gone = () => {
        x.destroy();
        y.destroy();
        socks.delete(x);
      };
      x.on("error", gone);
      x.on("close", gone);
    }
  });
  const listenPort = await freePort();
  await new Promise((resolve) => srv.listen(listenPort, "127.0.0.1", resolve));
  return {
    port: listenPort,
    cut() {
      for (const x of socks) x.destroy();
    },
    close() {
      this.cut();
      srv.close();
    },
  };
}

test("an event stream cut on the way is reopened within the grace: the session goes on, nothing is missed", LIMIT,
  async () => {
    const proxy = await cuttableProxy(a.port);
    try {
      const c = await Juggler.connect(`ws://127.0.0.1:${proxy.port}/ws`, { transports: ["sse"] });
      clients.push(c);
      const got = [];
      const unsub = c.subscribe("fb.cut", (args) => got.push(args));
      await unsub.ready;
      let lost = 0;
      c.addEventListener("close", () => (lost += 1));
      const other = await Juggler.connect(a.wsUrl, { WebSocket });
      clients.push(other);
      proxy.cut();
      for (let i = 0; i < 3; i++) await other.publish("fb.cut", i); // while the stream is down
      await until(() => got.length === 3, { timeout: T, what: "the events published while the stream was cut" });
      assert.deepEqual(got, [0, 1, 2]);
      assert.equal(lost, 0); // the same session: no reconnection, no re-subscription
      assert.equal(c.state, "open");
      assert.equal(await c.call("test.echo", "after the cut", { timeout: 5000 }), "after the cut");
    } finally {
      proxy.close();
    }
  });
