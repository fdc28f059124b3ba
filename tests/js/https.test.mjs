// The demo page and juggler.js served over https:// by `juggler up --tls-cert
// --tls-key`, in headless Chromium: the page connects with wss://, calls,
// subscribes and receives a PUB. Chromium trusts exactly the test
// certificate's public key (--ignore-certificate-errors-spki-list), not every
// certificate: a page of another certificate would still be refused.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { X509Certificate, createHash } from "node:crypto";
import { mkdtempSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";

import { JugglerProc, PYTHON, ROOT } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const T = 15000; // ms: every wait of this file

let up, browser, page, certs;

/** base64 SHA-256 of the certificate's SubjectPublicKeyInfo (Chromium's SPKI pin). */
function spkiHash(pemFile) {
  const der = new X509Certificate(readFileSync(pemFile)).publicKey.export({ type: "spki", format: "der" });
  return createHash("sha256").update(der).digest("base64");
}

before(async () => {
  certs = mkdtempSync(path.join(os.tmpdir(), "juggler-tls-"));
  const made = spawnSync(PYTHON, ["-m", "cli", "tls", "dev-cert", "--out", certs], { cwd: ROOT, encoding: "utf8" });
  assert.equal(made.status, 0, made.stderr);
  up = await JugglerProc.up(["--tls-cert", path.join(certs, "cert.pem"), "--tls-key", path.join(certs, "key.pem")]);
  const flags = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    `--ignore-certificate-errors-spki-list=${spkiHash(path.join(certs, "cert.pem"))}`,
  ];
  browser = await chromium.launch({ executablePath: CHROMIUM, args: flags, headless: true, timeout: 30000 });
  page = await browser.newPage();
  page.setDefaultTimeout(T);
});

after(async () => {
  if (browser) await browser.close();
  if (up) await up.stop();
});

test("the page is served over https and the client connects with wss://", async () => {
  const res = await page.goto(`https://localhost:${up.port}/`);
  assert.equal(res.status(), 200);
  const security = await res.securityDetails();
  assert.ok(security, "no TLS on the page");
  assert.match(security.protocol, /TLS 1\.[23]/);
  await page.locator("#state.open").waitFor();
  assert.equal(await page.locator("#url").textContent(), `wss://localhost:${up.port}/ws`);
  await page.locator('#subs li.acked[data-channel="demo"]').waitFor();
});

test("calls and pub-sub work over wss://", async () => {
  const r = await page.evaluate(() => window.juggler.call("test.echo", "over wss", { timeout: 5000 }));
  assert.equal(r, "over wss");
  await page.evaluate(() => window.juggler.publish("demo", { from: "https page" }));
  await page.locator("#events li", { hasText: "https page" }).first().waitFor({ timeout: T });
});

test("a plain ws:// connection to the TLS port fails", async () => {
  const failed = await page.evaluate(
    (port) =>
      new Promise((resolve) => {
        const ws = new WebSocket(`ws://localhost:${port}/ws`, "juggler.0");
        ws.onopen = () => resolve(false);
        ws.onerror = () => resolve(true);
      }),
    up.port,
  );
  assert.equal(failed, true);
});
