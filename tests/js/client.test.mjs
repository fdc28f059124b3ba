// Unit tests of juggler/static/juggler.js under Node's test runner, against a
// REAL `juggler up` (and `juggler server`s: with small limits for NACKs, and
// pinging every 100 ms for the keepalive, stopped with SIGSTOP to go silent).
// Node 20 has no global WebSocket: the `ws` package is injected (which also
// exercises the `headers` path that browsers cannot take).
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";

import {
  ConnectionClosedError,
  ConnectionLostError,
  ExpiredError,
  Juggler,
  MessageType,
  NackError,
} from "../../juggler/static/juggler.js";
import { JugglerProc, freePort, until } from "./helpers.mjs";

const opts = { WebSocket, initialDelay: 50, maxDelay: 500 };

let up;
const clients = [];

async function connect(url = up.wsUrl, extra = {}) {
  const c = await Juggler.connect(url, { ...opts, ...extra });
  clients.push(c);
  return c;
}

before(async () => {
  up = await JugglerProc.up();
});

after(async () => {
  for (const c of clients) c.close();
  await up.stop();
});

describe("calls", () => {
  test("test.echo and test.reverse return their results", async () => {
    const c = await connect();
    assert.equal(c.state, "open");
    assert.equal(await c.call("test.echo", "hello", { timeout: 5000 }), "hello");
    assert.equal(await c.call("test.reverse", "héllo, wörld 👋", { timeout: 5000 }), "👋 dlröw ,olléh");
    assert.equal(await c.call("test.delay", "10", { timeout: 5000 }), 10);
  });

  test("many concurrent calls each get their own result", async () => {
    const c = await connect();
    const words = Array.from({ length: 200 }, (_, i) => `w${i}`);
    const results = await Promise.all(words.map((w) => c.call("test.reverse", w, { timeout: 10000 })));
    assert.deepEqual(results, words.map((w) => [...w].reverse().join("")));
  });

  test("a callee error is a result, as on the wire", async () => {
    const c = await connect();
    const r = await c.call("test.delay", "not a number", { timeout: 5000 });
    assert.match(r.error.message, /integer/);
  });

  test("no result within the timeout rejects with ExpiredError; the late RES is ignored", async () => {
    const c = await connect();
    let expired;
    await assert.rejects(c.call("test.delay", "600", { timeout: 100 }), (err) => {
      assert.ok(err instanceof ExpiredError);
      assert.equal(err.timeout, 100);
      expired = err.uuid;
      assert.ok(expired);
      return true;
    });
    // The real server sends no RES once the call's TTL ran out (the callee
    // stores none), so a late RES is handed to the client the way its socket
    // would: it is dropped, with no error event, and the connection works on.
    const errors = [];
    c.addEventListener("error", (ev) => errors.push(ev.detail.error));
    c._onMessage(JSON.stringify({ meta: { type: 9 }, payload: { for: expired, args: 600 } }));
    assert.deepEqual(errors, []);
    assert.equal(await c.call("test.echo", "still here", { timeout: 5000 }), "still here");
  });

  test("invalid timeouts are refused locally", async () => {
    const c = await connect();
    await assert.rejects(c.call("test.echo", "x", { timeout: 0 }), RangeError);
    await assert.rejects(c.call("test.echo", "x", { timeout: NaN }), RangeError);
  });
});

describe("pub-sub", () => {
  test("a publish reaches channel and pattern subscribers of another connection", async () => {
    const a = await connect();
    const b = await connect();
    const got = [];
    const unsub = a.subscribe("news.sport", (args, ev) => got.push(["c", args, ev.channel, ev.pattern]));
    const punsub = a.subscribe("news.*", (args, ev) => got.push(["p", args, ev.channel, ev.pattern]), {
      pattern: true,
    });
    await Promise.all([unsub.ready, punsub.ready]);
    await b.publish("news.sport", { score: [1, 0] });
    await until(() => got.length === 2, { what: "two events" });
    got.sort();
    assert.deepEqual(got, [
      ["c", { score: [1, 0] }, "news.sport", undefined],
      ["p", { score: [1, 0] }, "news.sport", "news.*"],
    ]);
    await unsub();
    await punsub();
  });

  test("several handlers share one subscription; unsubscribe stops only its own", async () => {
    const a = await connect();
    const b = await connect();
    const one = [], two = [], barrier = [];
    const u1 = a.subscribe("share", (x) => one.push(x));
    const u2 = a.subscribe("share", (x) => two.push(x));
    const ub = a.subscribe("barrier", (x) => barrier.push(x));
    await Promise.all([u1.ready, u2.ready, ub.ready]);
    await b.publish("share", 1);
    await until(() => one.length === 1 && two.length === 1, { what: "first event" });
    await u1();
    await u1(); // idempotent
    await b.publish("share", 2);
    await until(() => two.length === 2, { what: "second event" });
    assert.deepEqual(one, [1]);
    await u2(); // the last handler: UNSB
    await b.publish("share", 3);
    await b.publish("barrier", "done"); // events of one connection arrive in order
    await until(() => barrier.length === 1, { what: "barrier event" });
    assert.deepEqual(two, [1, 2]);
    await ub();
  });

  test("a throwing handler does not stop the others (reported as an error event)", async () => {
    const a = await connect();
    const errors = [];
    a.addEventListener("error", (ev) => errors.push(ev.detail.error));
    const got = [];
    const u1 = a.subscribe("boom", () => {
      throw new Error("handler bug");
    });
    const u2 = a.subscribe("boom", (x) => got.push(x));
    await u2.ready;
    await a.publish("boom", null);
    await until(() => got.length === 1, { what: "event" });
    assert.equal(errors[0].message, "handler bug");
    await u1();
    await u2();
  });

  test("a publish without args is delivered with null", async () => {
    const a = await connect();
    const got = [];
    const u = a.subscribe("nullargs", (x, ev) => got.push([x, ev.args]));
    await u.ready;
    await a.publish("nullargs");
    await until(() => got.length === 1, { what: "event" });
    assert.deepEqual(got, [[null, null]]);
    await u();
  });
});

describe("connection", () => {
  test("the server restarts: the client reconnects, keeps its subscriptions and sends what waited", async () => {
    const port = await freePort();
    const srv = new JugglerProc(["up", "--listen", `127.0.0.1:${port}`], port);
    await srv.start();
    try {
      const a = await connect(srv.wsUrl);
      const states = [];
      a.addEventListener("statechange", (ev) => states.push(ev.detail.state));
      const got = [];
      const u = a.subscribe("restart", (x) => got.push(x));
      await u.ready;
      // sent, then the connection drops: whether it ran is unknown, so it fails
      const lost = assert.rejects(a.call("test.delay", "20000", { timeout: 30000 }), ConnectionLostError);
      await srv.stop();
      await lost;
      await until(() => a.state === "reconnecting", { what: "reconnecting" });
      const queued = a.call("test.echo", "queued while down", { timeout: 20000 });
      await srv.start();
      assert.equal(await queued, "queued while down");
      assert.equal(a.state, "open");
      assert.deepEqual(states.slice(0, 1), ["reconnecting"]);
      assert.equal(states.at(-1), "open");
      const b = await connect(srv.wsUrl);
      // the SUB was re-sent before the queued call, so it is in place by now
      await b.publish("restart", "after restart");
      await until(() => got.length === 1, { what: "event after the restart" });
      assert.deepEqual(got, ["after restart"]);
    } finally {
      await srv.stop();
    }
  });

  test("a dropped connection recovers the events of a channel with history, once each, in order", async () => {
    const srv = await JugglerProc.server('[[channels]]\nmatch = "hist.*"\nhistory_size = 100\n');
    try {
      const a = await connect(srv.wsUrl);
      const b = await connect(srv.wsUrl);
      const got = [];
      const unrecovered = [];
      a.addEventListener("unrecovered", (ev) => unrecovered.push(ev.detail.channel));
      const u = a.subscribe("hist.room", (x, ev) => got.push([x, ev.offset]));
      await u.ready;
      await b.publish("hist.room", 1);
      await until(() => got.length === 1, { what: "first event" });
      a._ws.terminate(); // the network drops: the client reconnects by itself
      await until(() => a.state === "reconnecting", { what: "reconnecting" });
      await b.publish("hist.room", 2);
      await b.publish("hist.room", 3);
      await until(() => a.state === "open", { what: "reconnected" });
      await b.publish("hist.room", 4);
      await until(() => got.length === 4, { what: "missed and live events" });
      assert.deepEqual(got, [[1, 1], [2, 2], [3, 3], [4, 4]]);
      assert.deepEqual(unrecovered, []);
    } finally {
      await srv.stop();
    }
  });

  test("close() rejects what is pending and is final", async () => {
    const c = await connect();
    const p = c.call("test.delay", "2000", { timeout: 5000 });
    c.close();
    c.close();
    await assert.rejects(p, ConnectionClosedError);
    assert.equal(c.state, "closed");
    await assert.rejects(c.call("test.echo", "x"), ConnectionClosedError);
  });

  test("close() while a connection attempt hangs is clean (no uncaught socket error)", async () => {
    let accepted;
    const connected = new Promise((r) => { accepted = r; });
    const silent = net.createServer(accepted); // accepts TCP, never answers the handshake
    await new Promise((r) => silent.listen(0, "127.0.0.1", r));
    try {
      const c = new Juggler(`ws://127.0.0.1:${silent.address().port}/ws`, opts);
      const first = assert.rejects(c._firstOpen, ConnectionClosedError);
      await connected; // the attempt now hangs in the handshake
      c.close();
      await first;
      await new Promise((r) => setTimeout(r, 100)); // an 'error' event would surface here
      assert.equal(c.state, "closed");
    } finally {
      silent.close();
    }
  });

  test("connecting to nothing rejects with ConnectionClosedError", async () => {
    const port = await freePort();
    await assert.rejects(Juggler.connect(`ws://127.0.0.1:${port}/ws`, opts), ConnectionClosedError);
  });

  test("a wrong path is refused (404), not retried", async () => {
    await assert.rejects(Juggler.connect(`ws://127.0.0.1:${up.port}/nope`, opts), ConnectionClosedError);
  });

  test("headers reach the server (Juggler-Allowed-Messages: pub forbids CALL)", async () => {
    const c = await connect(up.wsUrl, { allowedMessages: ["pub"], reconnect: false });
    await c.publish("allowed", 1);
    await assert.rejects(c.call("test.echo", "x", { timeout: 5000 }), ConnectionLostError);
    await until(() => c.state === "closed", { what: "closed" });
  });

  test("without header support, headers go in the query only when asked", async () => {
    const native = { ...opts, nativeWebSocket: true, reconnect: false };
    assert.throws(() => new Juggler(up.wsUrl, { ...native, headers: { "X-Token": "t" } }), TypeError);
    const c = await connect(up.wsUrl, { ...native, allowedMessages: "pub", headersAsQuery: true });
    assert.match(c.url, /\?juggler-allowed-messages=pub&juggler-keepalive=1$/);
    await c.publish("allowed", 1);
    await assert.rejects(c.call("test.echo", "x", { timeout: 5000 }), ConnectionLostError);
  });
});

describe("NACKs", () => {
  let srv;
  before(async () => {
    // no callees, tiny limits: the server refuses with NACK 500 (calls to URIs no callee
    // serves are queued until they expire, as with Redis, rather than refused with 404)
    srv = await JugglerProc.server("[server]\nmax_subscriptions = 1\n[memory]\ncall_cap = 1\nrefuse_unserved = false\n");
  });
  after(async () => {
    await srv.stop();
  });

  test("a refused call rejects with NackError", async () => {
    const c = await connect(srv.wsUrl);
    const first = assert.rejects(c.call("nobody.home", "x", { timeout: 300 }), ExpiredError); // never served
    await assert.rejects(c.call("nobody.home", "y", { timeout: 300 }), (err) => {
      assert.ok(err instanceof NackError);
      assert.equal(err.code, 500);
      assert.equal(err.uri, "nobody.home");
      assert.match(err.serverMessage, /capacity/);
      return true;
    });
    await first;
  });

  test("a call no callee serves is refused with NACK 404 by the in-memory broker", async () => {
    const c = await connect();
    await assert.rejects(c.call("nobody.home", "x", { timeout: 2000 }), (err) => {
      assert.ok(err instanceof NackError);
      assert.equal(err.code, 404);
      assert.match(err.serverMessage, /no callee serves nobody.home/);
      return true;
    });
  });

  test("a refused subscription rejects its ready promise and drops the handler", async () => {
    const c = await connect(srv.wsUrl);
    const u1 = c.subscribe("one", () => {});
    await u1.ready;
    const u2 = c.subscribe("two", () => {});
    await assert.rejects(u2.ready, (err) => err instanceof NackError && /too many subscriptions/.test(err.message));
    await u1();
    const u3 = c.subscribe("two", () => {}); // room again
    await u3.ready;
  });
});

describe("keepalive", () => {
  // a `juggler server` that pings every 100 ms (in-memory broker, no callees)
  const pinging = (extra = "") => JugglerProc.server(`[server]\nping_interval = 0.1\npong_timeout = 5\n${extra}`);

  // a `ws` socket that counts the KEEPALIVE messages it receives
  function counting() {
    const seen = { keepalives: 0 };
    class Counting extends WebSocket {
      constructor(...args) {
        super(...args);
        this.on("message", (data) => {
          if (JSON.parse(data).meta.type === MessageType.KEEPALIVE) seen.keepalives += 1;
        });
      }
    }
    return { seen, Counting };
  }

  test("the client asks for KEEPALIVE messages and stays connected while they come", async () => {
    const srv = await pinging();
    try {
      const { seen, Counting } = counting();
      const c = await connect(srv.wsUrl, { WebSocket: Counting, keepaliveGrace: 1000 });
      const lost = [];
      c.addEventListener("close", (ev) => lost.push(ev.detail.error));
      assert.equal(c.url, `${srv.wsUrl}?juggler-keepalive=1`); // the query parameter, whatever the WebSocket
      await until(() => seen.keepalives >= 15, { what: "15 KEEPALIVEs: longer than interval + grace" });
      assert.equal(c.state, "open");
      assert.deepEqual(lost, []);
      await c.publish("still.here", 1);
    } finally {
      await srv.stop();
    }
  });

  test("a server gone silent (stopped, no FIN, no reset) is left: the client reconnects and keeps its subscriptions", async () => {
    const srv = await pinging();
    try {
      const a = await connect(srv.wsUrl, { keepaliveGrace: 300 });
      const lost = [];
      a.addEventListener("close", (ev) => lost.push(ev.detail.error));
      const got = [];
      const u = a.subscribe("paused", (x) => got.push(x));
      await u.ready;
      process.kill(srv.proc.pid, "SIGSTOP");
      try {
        await until(() => a.state === "reconnecting", { what: "the silence noticed" });
      } finally {
        process.kill(srv.proc.pid, "SIGCONT");
      }
      assert.ok(lost[0] instanceof ConnectionLostError);
      assert.match(lost[0].message, /nothing from the server for \d+ ms/);
      // the attempt made while the server was stopped completes once it runs again
      await until(() => a.state === "open", { timeout: 20000, what: "reconnected" });
      const b = await connect(srv.wsUrl);
      await b.publish("paused", "after the pause");
      await until(() => got.length === 1, { what: "event after the pause" });
      assert.deepEqual(got, ["after the pause"]);
    } finally {
      await srv.stop();
    }
  });

  test("keepalive: false asks for nothing; a server that sends none is waited for", async () => {
    const srv = await pinging();
    try {
      const { seen, Counting } = counting();
      const c = await connect(srv.wsUrl, { WebSocket: Counting, keepalive: false });
      assert.equal(c.url, srv.wsUrl);
      await c.publish("quiet", 1); // a KEEPALIVE would have come before the ACK
      assert.equal(seen.keepalives, 0);
      assert.equal(c._watch.limit, 0);
    } finally {
      await srv.stop();
    }
    const off = await JugglerProc.server("[server]\nping_interval = 0\n"); // pings off: no KEEPALIVE either
    try {
      const c = await connect(off.wsUrl, { keepaliveGrace: 1 });
      await c.publish("quiet", 1);
      assert.equal(c._watch.limit, 0); // never armed: the client waits as long as it takes
      assert.equal(c.state, "open");
    } finally {
      await off.stop();
    }
    assert.throws(() => new Juggler(up.wsUrl, { ...opts, keepaliveGrace: 0 }), RangeError);
  });
});

describe("arguments", () => {
  test("args that are not JSON reject at once; queued args are serialized when called", async () => {
    const c = await connect();
    await assert.rejects(c.call("test.echo", 10n, { timeout: 1000 }), TypeError);
    const cyclic = {};
    cyclic.self = cyclic;
    await assert.rejects(c.publish("x", cyclic), TypeError);
    const got = [];
    const u = c.subscribe("mutated", (x) => got.push(x));
    await u.ready;
    const args = { n: 1 };
    const p = c.publish("mutated", args);
    args.n = 2;
    await p;
    await until(() => got.length === 1, { what: "event" });
    assert.deepEqual(got, [{ n: 1 }]);
    await u();
  });
});
