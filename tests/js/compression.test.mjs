// permessage-deflate in a real headless Chromium (Debian's /usr/bin/chromium
// driven by playwright-core): the browser offers it by itself, a server with
// `server.compression = true` agrees (the handshake response, read through the
// DevTools protocol), and juggler.js works unchanged over compressed frames,
// large messages both ways; a server with compression off agrees to nothing.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";

import { JugglerProc } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"];
const T = 15000;

let browser;
const servers = [];

before(async () => {
  browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true, timeout: 30000 });
});

after(async () => {
  if (browser) await browser.close();
  for (const s of servers) await s.stop();
});

/** The demo page of `juggler up extra…`, and the Sec-WebSocket-Extensions its websocket got back. */
async function open(extra) {
  const up = await JugglerProc.up(extra);
  servers.push(up);
  const page = await browser.newPage();
  page.setDefaultTimeout(T);
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  const answered = new Promise((resolve) => {
    cdp.on("Network.webSocketHandshakeResponseReceived", (ev) => {
      const h = ev.response.headers;
      const key = Object.keys(h).find((k) => k.toLowerCase() === "sec-websocket-extensions");
      resolve(key ? h[key] : "");
    });
  });
  await page.goto(up.httpUrl);
  await page.locator("#state.open").waitFor();
  return { page, extensions: await answered };
}

test("Chromium offers permessage-deflate and a compressing server agrees; juggler.js needs nothing", async () => {
  const { page, extensions } = await open(["--set", "server.compression=true", "--set", "server.compression_threshold=0"]);
  assert.match(extensions, /^permessage-deflate; server_no_context_takeover; client_no_context_takeover$/);
  const big = "héllo wörld ".repeat(2000);
  const r = await page.evaluate((s) => window.juggler.call("test.reverse", s, { timeout: 5000 }), big);
  assert.equal(r, [...big].reverse().join(""));
  await page.close();
});

test("with compression off (the default) nothing is agreed", async () => {
  const { page, extensions } = await open([]);
  assert.equal(extensions, "");
  assert.equal(await page.evaluate(() => window.juggler.call("test.echo", "x", { timeout: 5000 })), "x");
  await page.close();
});
