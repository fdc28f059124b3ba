// The demo page of `juggler up` in a real headless Chromium (Debian's
// /usr/bin/chromium driven by playwright-core; no downloaded browsers): the
// page loads, calls test.echo / test.reverse, shows a PUB made by the REPL
// (`juggler client` through a pipe) and by another tab, survives a server
// restart on the same port, and leaves a screenshot in artifacts/demo.png.
// The client in Chromium also leaves a server that goes silent (stopped with
// SIGSTOP), which it notices through KEEPALIVE messages alone.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";

import { JugglerProc, ROOT, repl } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];
const ARTIFACTS = path.join(ROOT, "artifacts");
const T = 15000; // ms: every wait of this file

let up, browser, page;
const problems = []; // console errors and page errors of the page

before(async () => {
  up = await JugglerProc.up();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true, timeout: 30000 });
  page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.setDefaultTimeout(T);
  page.on("pageerror", (err) => problems.push(`pageerror: ${err.message}`));
  page.on("console", (msg) => {
    // the browser logs failed websocket attempts while the server restarts
    if (msg.type() === "error" && !/WebSocket connection to .* failed|ERR_CONNECTION_REFUSED/.test(msg.text())) {
      problems.push(`console: ${msg.text()} (${msg.location().url})`);
    }
  });
});

after(async () => {
  if (browser) await browser.close();
  if (up) await up.stop();
});

async function eventTexts(p = page) {
  return p.locator("#events li").allTextContents();
}

async function waitForEvent(text, p = page) {
  await p.locator("#events li", { hasText: text }).first().waitFor({ timeout: T });
}

test("the page loads, connects and subscribes to the demo channel", async () => {
  const res = await page.goto(up.httpUrl);
  assert.equal(res.status(), 200);
  assert.equal(await page.title(), "juggler — browser demo");
  await page.locator("#state.open").waitFor();
  await page.locator('#subs li.acked[data-channel="demo"]').waitFor();
  assert.equal(await page.locator("#url").textContent(), up.wsUrl);
});

test("calls to test.echo and test.reverse show the right results and a latency", async () => {
  await page.selectOption("#call-uri", "test.echo");
  await page.fill("#call-args", '"hello from chromium"');
  await page.click("#call-btn");
  await page.locator("#call-result", { hasText: '"hello from chromium"' }).waitFor();
  assert.match(await page.locator("#call-latency").textContent(), /^\d+(\.\d+)? ms$/);

  await page.selectOption("#call-uri", "test.reverse");
  await page.fill("#call-args", '"héllo wörld"');
  await page.click("#call-btn");
  await page.locator("#call-result", { hasText: '"dlröw olléh"' }).waitFor();
  assert.equal(await page.locator("#call-history tr").count(), 2);

  // and straight through the client object the page exposes
  const r = await page.evaluate(() => window.juggler.call("test.reverse", "abc", { timeout: 5000 }));
  assert.equal(r, "cba");
});

test("the browser's WebSocket cannot send headers: refused, or sent in the query when asked", async () => {
  const r = await page.evaluate(async () => {
    const { Juggler } = await import("/juggler.js");
    const url = document.getElementById("url").textContent;
    let refused = "";
    try {
      await Juggler.connect(url, { headers: { Authorization: "Bearer x" } });
    } catch (err) {
      refused = err.name;
    }
    const c = await Juggler.connect(url, { allowedMessages: ["pub"], headersAsQuery: true, reconnect: false });
    await c.publish("elsewhere", 1);
    let callError = "";
    try {
      await c.call("test.echo", "x", { timeout: 5000 }); // forbidden: the server drops the connection
    } catch (err) {
      callError = err.name;
    }
    return { refused, url: c.url, callError, state: c.state };
  });
  assert.deepEqual(r, {
    refused: "TypeError",
    url: `${up.wsUrl}?juggler-allowed-messages=pub&juggler-keepalive=1`,
    callError: "ConnectionLostError",
    state: "closed",
  });
});

test("in the browser, a server gone silent is noticed through KEEPALIVE messages and left", async () => {
  // a browser sees no websocket ping: the client asks for KEEPALIVE messages in the URL
  const srv = await JugglerProc.server("[server]\nping_interval = 0.1\npong_timeout = 5\n");
  const other = await browser.newPage();
  try {
    await other.goto(up.httpUrl); // the page's origin serves /juggler.js
    const first = await other.evaluate(async (url) => {
      const { Juggler } = await import("/juggler.js");
      window.ka = await Juggler.connect(url, { keepaliveGrace: 300, initialDelay: 50, maxDelay: 500 });
      window.kaGot = [];
      window.kaLost = [];
      window.ka.addEventListener("close", (ev) => window.kaLost.push(ev.detail.error.message));
      const u = window.ka.subscribe("paused", (x) => window.kaGot.push(x));
      await u.ready;
      return { url: window.ka.url, armed: window.ka._watch.limit };
    }, srv.wsUrl);
    assert.deepEqual(first, { url: `${srv.wsUrl}?juggler-keepalive=1`, armed: 100 + 300 });
    process.kill(srv.proc.pid, "SIGSTOP");
    try {
      await other.waitForFunction(() => window.ka.state === "reconnecting", null, { timeout: T });
    } finally {
      process.kill(srv.proc.pid, "SIGCONT");
    }
    await other.waitForFunction(() => window.ka.state === "open", null, { timeout: T });
    const r = await other.evaluate(async (url) => {
      const { Juggler } = await import("/juggler.js");
      const b = await Juggler.connect(url);
      await b.publish("paused", "after the pause");
      b.close();
      return window.kaLost;
    }, srv.wsUrl);
    assert.match(r[0], /nothing from the server for \d+ ms/);
    await other.waitForFunction(() => window.kaGot.length === 1 && window.kaGot[0] === "after the pause", null,
      { timeout: T });
    await other.evaluate(() => window.ka.close());
  } finally {
    await other.close();
    await srv.stop();
  }
});

test("a PUB from the REPL (juggler client through a pipe) appears in the page", async () => {
  const out = await repl([`connect ${up.wsUrl}`, 'pub 1 demo "hello from the REPL"']);
  assert.match(out, /ACK .* for PUB/);
  await waitForEvent('"hello from the REPL"');
});

test("a PUB from another tab appears in the page", async () => {
  const other = await browser.newPage();
  try {
    await other.goto(up.httpUrl);
    await other.locator('#subs li.acked[data-channel="demo"]').waitFor({ timeout: T });
    await other.fill("#pub-args", '{"from": "tab 2"}');
    await other.click("#pub-btn");
    await waitForEvent('{"from":"tab 2"}');
    await waitForEvent('{"from":"tab 2"}', other); // its own subscription hears it too
  } finally {
    await other.close();
  }
});

test("the server restarts on the same port: the page reconnects and keeps its subscription", async () => {
  await page.evaluate(() => {
    window.__states = [];
    window.juggler.addEventListener("statechange", (ev) => window.__states.push(ev.detail.state));
  });
  await up.restart();
  await page.waitForFunction(() => window.__states.includes("reconnecting") && window.juggler.state === "open", null,
    { timeout: T });
  // the subscription was restored on the new connection: a REPL PUB reaches the page
  await repl([`connect ${up.wsUrl}`, 'pub 1 demo "after the restart"']);
  await waitForEvent('"after the restart"');
  const r = await page.evaluate(() => window.juggler.call("test.echo", "calls work again", { timeout: 5000 }));
  assert.equal(r, "calls work again");
  assert.ok((await eventTexts()).length >= 3);
});

test("the live chart follows the server's counters; screenshot", async () => {
  const other = await browser.newPage(); // a second client on the chart
  await other.goto(up.httpUrl);
  await other.locator("#state.open").waitFor({ timeout: T });
  // the server's own count, not the page's last poll: right after the restart
  // test the page may still show the previous server's (higher) count
  const calls = () => page.evaluate(async () => (await (await fetch("/stats.json", { cache: "no-store" })).json()).calls);
  for (let round = 1; round <= 2; round++) {
    const before = await calls();
    await page.click("#burst-btn");
    await page.locator("#burst-result", { hasText: "500 ok" }).waitFor({ timeout: 30000 });
    // a later poll of /stats.json sees the calls
    await page.waitForFunction((n) => Number(document.getElementById("stat-calls").textContent) >= n,
      before + 500, { timeout: T });
  }
  await page.waitForFunction(() => Number(document.getElementById("stat-clients").textContent) >= 2, null,
    { timeout: T });
  const painted = await page.evaluate(() => {
    const c = document.getElementById("chart");
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
    return n;
  });
  assert.ok(painted > 1000, `chart has ${painted} painted pixels`);
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, "demo.png"), fullPage: true });
  await other.close();
  assert.deepEqual(problems, []);
});
