// Join/leave notices in juggler/static/juggler.js (subscribe's onJoin and
// onLeave), against a REAL `juggler server` whose channels keep presence.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";

import { Juggler, NackError } from "../../juggler/static/juggler.js";
import { JugglerProc, until } from "./helpers.mjs";

const opts = { WebSocket, initialDelay: 50, maxDelay: 500 };

let srv;
const clients = [];

async function connect(extra = {}) {
  const c = await Juggler.connect(srv.wsUrl, { ...opts, ...extra });
  clients.push(c);
  return c;
}

before(async () => {
  srv = await JugglerProc.server(
    '[[channels]]\nmatch = "chat.*"\npresence = true\njoin_leave = true\n\n' +
      '[[channels]]\nmatch = "quiet.*"\npresence = true\n',
  );
});

after(async () => {
  for (const c of clients) c.close();
  await srv.stop();
});

describe("join/leave notices", () => {
  test("onJoin/onLeave get the notices; event handlers and other clients never do", async () => {
    const a = await connect();
    const b = await connect();
    const joins = [];
    const leaves = [];
    const aEvents = [];
    const bEvents = [];
    const ua = a.subscribe("chat.room", (x) => aEvents.push(x), {
      onJoin: (info, ev) => joins.push([info, ev.channel]),
      onLeave: (info) => leaves.push(info),
    });
    await ua.ready;
    await until(() => joins.length === 1, { what: "its own join" });
    const [me, channel] = joins[0];
    assert.equal(channel, "chat.room");
    assert.equal(typeof me.client, "string");
    assert.equal(me.user, null);

    const ub = b.subscribe("chat.room", (x) => bEvents.push(x)); // asks for nothing
    await ub.ready;
    await until(() => joins.length === 2, { what: "b's join" });
    const other = joins[1][0];
    assert.notEqual(other.client, me.client);
    await ub();
    await until(() => leaves.length === 1, { what: "b's leave" });
    assert.deepEqual(leaves[0], other);

    await b.subscribe("chat.room", (x) => bEvents.push(x)).ready;
    await until(() => joins.length === 3, { what: "b again" });
    await b.publish("chat.room", "hello");
    await until(() => aEvents.length === 1 && bEvents.length === 1, { what: "the publication" });
    assert.deepEqual(aEvents, ["hello"]); // no notice reached the event handlers
    assert.deepEqual(bEvents, ["hello"]);
    await ua();
  });

  test("a handler asking later turns the notices on for a subscription already made", async () => {
    const a = await connect();
    const b = await connect();
    await a.subscribe("chat.late", () => {}).ready;
    const joins = [];
    a.subscribe("chat.late", () => {}, { onJoin: (info) => joins.push(info) });
    // the SUB asking for them goes out at once; the ACK of a later message of
    // the same connection says the server has processed it
    await a.publish("chat.late", "sync");
    await b.subscribe("chat.late", () => {}).ready;
    await until(() => joins.length >= 1, { what: "b's join" });
    // only b's: a's own join went out when it first subscribed, before it asked
    assert.equal(joins.length, 1);
  });

  test("after a reconnect the notices come again (the new connection joins)", async () => {
    const a = await connect();
    const joins = [];
    await a.subscribe("chat.again", () => {}, { onJoin: (info) => joins.push(info) }).ready;
    await until(() => joins.length === 1, { what: "its own join" });
    a._ws.terminate();
    await until(() => a.state === "open" && joins.length >= 2, { what: "its join after reconnecting" });
    assert.notEqual(joins.at(-1).client, joins[0].client);
  });

  test("a channel that sends no notices refuses the subscription that asks", async () => {
    const a = await connect();
    const u = a.subscribe("quiet.room", () => {}, { onJoin: () => {} });
    await assert.rejects(u.ready, (err) => err instanceof NackError && err.code === 400);
    assert.throws(() => a.subscribe("chat.x", () => {}, { onJoin: "nope" }), TypeError);
  });
});
