// Token refresh in juggler/static/juggler.js (getToken, getSubscriptionToken),
// against a REAL `juggler server` with HS256 tokens that live one second and a
// private channel. Tokens are signed here with node:crypto (HMAC-SHA256).
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";

import { Juggler, NackError } from "../../juggler/static/juggler.js";
import { JugglerProc, until } from "./helpers.mjs";

const SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256";
const opts = { WebSocket, initialDelay: 50, maxDelay: 500 };

function b64url(data) {
  return Buffer.from(data).toString("base64url");
}

/** An HS256 JWT with `claims`, expiring in `lifetime` seconds. */
function jwt(claims, lifetime) {
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const body = b64url(JSON.stringify({ sub: "alice", exp: Date.now() / 1000 + lifetime, ...claims }));
  const sig = createHmac("sha256", SECRET).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

let srv;
const clients = [];

async function connect(extra = {}) {
  const c = await Juggler.connect(srv.wsUrl, { ...opts, ...extra });
  clients.push(c);
  return c;
}

before(async () => {
  srv = await JugglerProc.server(
    `[auth]\njwt_secret = "${SECRET}"\nrefresh_warning = 0.5\n\n` +
      '[[channels]]\nmatch = "private.*"\nprivate = true\n',
  );
});

after(async () => {
  for (const c of clients) c.close();
  await srv.stop();
});

describe("token refresh", () => {
  test("getToken renews the connection across several expiries", async () => {
    let given = 0;
    const states = [];
    const c = await connect({
      getToken: async () => {
        given += 1;
        return jwt({}, 2);
      },
    });
    c.addEventListener("statechange", (ev) => states.push(ev.detail.state));
    await until(() => given >= 4, { timeout: 15000, what: "three renewals" });
    await c.publish("public", "still here", { timeout: 5000 });
    assert.deepEqual(states, []); // never dropped: the same connection all along
  });

  test("a token not renewed closes the connection at expiry (4001); it reconnects with a new one", async () => {
    const errors = [];
    const c = await connect({ getToken: async () => jwt({}, 1.5) });
    // from now on the renewal is refused (another subject); the next connection takes it
    c.options.getToken = async () => jwt({ sub: "mallory" }, 600);
    c.addEventListener("error", (ev) => errors.push(String(ev.detail.error && ev.detail.error.message)));
    await until(() => errors.some((m) => /4001 token expired/.test(m)), { timeout: 10000, what: "the 4001 close" });
    assert.ok(errors.some((m) => /NACK 403/.test(m)), errors.join("; "));
    await until(() => c.state === "open", { what: "the reconnection" });
    await c.publish("public", "back", { timeout: 5000 });
  });

  test("a private channel takes its subscription token, renewed with SUB_REFRESH", async () => {
    let asked = 0;
    const c = await connect({
      getToken: async () => jwt({}, 600),
      getSubscriptionToken: async (channel) => {
        if (!channel.startsWith("private.")) return null;
        asked += 1;
        return jwt({ channel }, 2);
      },
    });
    const got = [];
    const unsub = c.subscribe("private.room", (args) => got.push(args));
    await unsub.ready;
    await until(() => asked >= 3, { timeout: 15000, what: "two subscription renewals" });
    const pub = await connect({ getToken: async () => jwt({ sub: "bob" }, 600) });
    await pub.publish("private.room", { n: 1 });
    await until(() => got.length === 1, { what: "the event" });
    assert.deepEqual(got, [{ n: 1 }]);
  });

  test("a subscription token not renewed ends the subscription, not the connection", async () => {
    let asked = 0;
    const c = await connect({
      getToken: async () => jwt({}, 600),
      getSubscriptionToken: async (channel) => {
        asked += 1;
        return asked === 1 ? jwt({ channel }, 1.5) : null; // no renewal
      },
    });
    const ended = [];
    c.addEventListener("subscriptionend", (ev) => ended.push(ev.detail));
    const unsub = c.subscribe("private.gone", () => {});
    await unsub.ready;
    await until(() => ended.length === 1, { timeout: 10000, what: "the end of the subscription" });
    assert.deepEqual(ended, [{ channel: "private.gone", pattern: false }]);
    assert.equal(c.state, "open");
    await c.publish("public", "still connected", { timeout: 5000 });
  });

  test("a private channel without a token is refused", async () => {
    const c = await connect({ getToken: async () => jwt({}, 600) });
    const unsub = c.subscribe("private.x", () => {});
    await assert.rejects(unsub.ready, (err) => err instanceof NackError && err.code === 403);
  });
});
