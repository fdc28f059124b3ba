// Server-side subscriptions (onServerPublication, the "publication" event) and
// the history()/presence() requests of juggler/static/juggler.js, against a
// REAL `juggler server` with JWT auth and channels that let clients read
// their history and presence.
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";

import { Juggler, NackError } from "../../juggler/static/juggler.js";
import { JugglerProc, until } from "./helpers.mjs";

const SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256";
const opts = { WebSocket, initialDelay: 50, maxDelay: 500 };

let srv;
const clients = [];

function b64url(text) {
  return Buffer.from(text).toString("base64url");
}

function token(claims) {
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const body = b64url(JSON.stringify({ exp: Math.floor(Date.now() / 1000) + 600, ...claims }));
  const sig = createHmac("sha256", SECRET).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

async function connect(claims, extra = {}) {
  const c = await Juggler.connect(`${srv.wsUrl}?token=${token(claims)}`, { ...opts, ...extra });
  clients.push(c);
  return c;
}

before(async () => {
  srv = await JugglerProc.server(
    `[auth]\njwt_secret = "${SECRET}"\n\n` +
      '[[channels]]\nmatch = "h.*"\nhistory_size = 10\nhistory_ttl = 60\nclient_history = true\n\n' +
      '[[channels]]\nmatch = "p.*"\npresence = true\nclient_presence = true\n',
  );
});

after(async () => {
  for (const c of clients) c.close();
  await srv.stop();
});

describe("server-side subscriptions", () => {
  test("events of channels never subscribed go to onServerPublication and the publication event", async () => {
    const got = [];
    const dispatched = [];
    const alice = await connect({ sub: "alice", channels: ["news", "h.feed"] }, {
      onServerPublication: (args, ev) => got.push([ev.channel, args, ev.offset]),
    });
    alice.addEventListener("publication", (ev) => dispatched.push(ev.detail.channel));
    const bob = await connect({ sub: "bob" });
    // alice's first message is answered after her server-side subscriptions took effect
    await alice.subscribe("own", () => {}).ready;
    await bob.publish("news", { n: 1 });
    await bob.publish("h.feed", "kept");
    await until(() => got.length === 2, { what: "the server-side events" });
    assert.deepEqual(got, [["news", { n: 1 }, undefined], ["h.feed", "kept", 1]]);
    assert.deepEqual(dispatched, ["news", "h.feed"]);
    const since = alice.serverPositions.get("h.feed");
    assert.equal(since.offset, 1);
    assert.equal(alice.serverPositions.get("news"), undefined); // no history there
    await bob.publish("h.feed", "missed");
    await until(() => got.length === 3, { what: "the third event" });
    const page = await alice.history("h.feed", { since });
    assert.deepEqual([page.events.map((e) => e.args), page.recovered], [["missed"], true]);
  });
});

describe("history and presence requests", () => {
  test("history with limit and since; presence; refusals are NackErrors", async () => {
    const alice = await connect({ sub: "alice" });
    await alice.publish("h.room", "a");
    await alice.publish("h.room", "b");
    const page = await alice.history("h.room");
    assert.deepEqual(page.events.map((e) => [e.args, e.offset]), [["a", 1], ["b", 2]]);
    assert.equal(page.offset, 2);
    assert.deepEqual((await alice.history("h.room", { limit: 1 })).events.map((e) => e.args), ["a"]);
    const since = await alice.history("h.room", { since: { offset: 1, epoch: page.epoch } });
    assert.deepEqual([since.events.map((e) => e.args), since.recovered], [["b"], true]);

    await alice.subscribe("p.room", () => {}).ready;
    const members = Object.values(await alice.presence("p.room"));
    assert.deepEqual(members.map((m) => m.user), ["alice"]);

    await assert.rejects(alice.history("plain"), (err) => err instanceof NackError && err.code === 400);
    await assert.rejects(alice.presence("h.room"), (err) => err instanceof NackError && err.code === 400);
  });
});
