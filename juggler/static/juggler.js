// juggler.js — a dependency-free ES module client for the juggler.0 protocol.
//
//   import { Juggler } from "/juggler.js";
//   const c = await Juggler.connect("ws://127.0.0.1:9000/ws");
//   const r = await c.call("test.echo", "hello", { timeout: 5000 });   // ms
//   const unsub = c.subscribe("chat", (args, ev) => console.log(ev.channel, args));
//   await unsub.ready;                  // the server ACKed the SUB
//   await c.publish("chat", { text: "hi" });
//   await unsub();
//   c.close();
//
// Wire format (see docs/protocols/juggler.md): one JSON object per text
// frame, {"meta":{"type":N,"uuid":"..."},"payload":{...}}; CALL=1 PUB=2 SUB=3
// UNSB=4 NACK=7 ACK=8 RES=9 EVNT=10; CALL timeouts travel in nanoseconds.
// KEEPALIVE=256 is this server's extension, sent only to clients that ask
// (the juggler-keepalive=1 query parameter): {"interval_ms": N}.
//
// Contract:
// - call() resolves with the RES args, rejects with NackError (the server
//   refused it), ExpiredError (no RES within `timeout` ms; a late RES is
//   ignored) or ConnectionLostError (the connection dropped after the CALL was
//   sent: whether it ran is unknown, so it is never re-sent).
// - Messages made while reconnecting are queued (their timers run) and sent
//   once the connection is back; subscriptions are restored before them.
// - Reconnection: exponential backoff with jitter, forever unless
//   `reconnect: false` or `maxAttempts`. close() is final and idempotent.
// - Keepalive (`keepalive: true`): a browser cannot see websocket pings, so
//   the client asks the server for KEEPALIVE messages; once one said the
//   interval, nothing received for interval + `keepaliveGrace` ms means the
//   server is gone: the connection is dropped and reconnected like any other.
// - Tokens (getToken, getSubscriptionToken), server-side subscriptions
//   (onServerPublication), history() and presence(), and the HTTP fallback
//   (transports, in fallback.js): the manual's "Browser client" page.
// Types: juggler.d.ts next to this file.

import { FallbackSocket } from "./fallback.js";
import {
  ACK, CALL, EVNT, EXPIRING, HISTORY, KEEPALIVE, KEEPALIVE_QUERY, NACK, PRESENCE, PUB, REFRESH, REFRESH_QUERY,
  REPLY, RES, SUB, SUB_REFRESH, SUBPROTOCOL, UNSB, keepaliveInterval, uuid4,
  ConnectionClosedError, ConnectionLostError, ExpiredError, JugglerError, NackError,
} from "./protocol.js";

export {
  ConnectionClosedError, ConnectionLostError, ExpiredError, JugglerError, MessageType, NackError, SUBPROTOCOL,
} from "./protocol.js";

// helpers ---------------------------------------------------------------------

// CustomEvent is global in browsers and Node >= 19
const CustomEvent =
  globalThis.CustomEvent ||
  class CustomEvent extends Event {
    constructor(type, init = {}) {
      super(type, init);
      this.detail = init.detail ?? null;
    }
  };

function noop() {}

// a monotonic clock (ms): a wall clock set back must not look like silence
const clock =
  globalThis.performance && typeof globalThis.performance.now === "function"
    ? () => globalThis.performance.now()
    : () => Date.now();

// Forget a socket. Its error handler stays: with the `ws` package an 'error'
// without a listener (e.g. closing a socket that is still connecting) would
// be an uncaught exception.
function detach(ws) {
  ws.onopen = ws.onmessage = ws.onclose = null;
  ws.onerror = noop;
}

function subKey(channel, pattern) {
  return (pattern ? "p:" : "c:") + channel;
}

function checkTimeout(timeout) {
  if (!Number.isFinite(timeout) || timeout < 1) {
    throw new RangeError(`timeout must be a number of milliseconds >= 1, got ${timeout}`);
  }
  return Math.floor(timeout);
}

const DEFAULTS = Object.freeze({
  timeout: 60000, // ms: calls, publishes, subscriptions
  connectTimeout: 10000, // ms: one connection attempt
  reconnect: true,
  initialDelay: 250, // ms: first reconnection delay
  maxDelay: 10000, // ms: backoff cap
  factor: 2,
  jitter: 0.5, // each delay is scaled by a random factor in [1 - jitter, 1]
  maxAttempts: Infinity, // consecutive failed reconnection attempts before giving up
  maxQueue: 1000, // messages queued while disconnected
  keepalive: true, // ask the server for KEEPALIVE messages and drop a connection that goes silent
  keepaliveGrace: 10000, // ms past the server's announced interval before its silence means it is gone
  getToken: null, // async () => the connection's token: at every connection and when it expires
  getSubscriptionToken: null, // async (channel) => a private channel's subscription token, or null
  tokenParam: "token", // the query parameter carrying the token when headers cannot be sent
  transports: ["websocket", "sse"], // in order of preference: the next one is tried when one fails
  websocketTimeout: 5000, // ms a websocket attempt may take when a fallback follows it (a proxy that swallows it)
  websocketRetry: 30000, // ms between attempts to go back to the websocket while on the fallback; 0: never
});

const TRANSPORTS = ["websocket", "sse"];
export class Juggler extends EventTarget {
  /** Connect; resolves once the first connection is open (rejects if it fails). */
  static async connect(url, options = {}) {
    const c = new Juggler(url, options);
    await c._firstOpen;
    return c;
  }

  constructor(url, options = {}) {
    super();
    this.options = { ...DEFAULTS, ...options };
    const o = this.options;
    this._WebSocket = o.WebSocket || globalThis.WebSocket;
    const transports = [].concat(o.transports);
    if (!transports.length || transports.some((t) => !TRANSPORTS.includes(t))) {
      throw new RangeError(`transports must be a non-empty list of ${TRANSPORTS.join(", ")}, got ${o.transports}`);
    }
    this._transports = transports;
    this._ti = 0; // the transport in use (or being tried): an index into _transports
    if (transports.includes("websocket") && typeof this._WebSocket !== "function") {
      throw new TypeError("no WebSocket in this runtime: pass options.WebSocket (e.g. the `ws` package)");
    }
    if (!(Number.isFinite(o.keepaliveGrace) && o.keepaliveGrace > 0)) {
      throw new RangeError(`keepaliveGrace must be a number of milliseconds > 0, got ${o.keepaliveGrace}`);
    }
    this._protocols = o.protocols ?? [SUBPROTOCOL];
    this._headers = { ...(o.headers || {}) };
    if (o.allowedMessages) {
      this._headers["Juggler-Allowed-Messages"] = [].concat(o.allowedMessages).join(",");
    }
    // Native WebSockets (browsers, Node >= 22) cannot send headers: a custom
    // constructor is assumed `ws`-style (url, protocols, {headers}).
    this._canSendHeaders = Boolean(o.WebSocket) && !o.nativeWebSocket;
    this.url = this._buildUrl(String(url));
    this._state = "connecting";
    this._ws = null;
    this._watch = null; // the current socket's keepalive watch
    this._attempt = 0;
    this._timer = null;
    this._pending = new Map(); // uuid -> {type, resolve, reject, timer, uri|channel, sent, frame}
    this._queue = []; // uuids waiting for a connection, in order
    this._subs = new Map(); // key -> {channel, pattern, handlers:Set, acked, ready}
    // channel -> {offset, epoch}: the last event of each server-side subscription with history
    this.serverPositions = new Map();
    this._closedByUser = false;
    this._firstOpen = new Promise((resolve, reject) => {
      this._resolveFirst = resolve;
      this._rejectFirst = reject;
    });
    this._firstOpen.catch(() => {});
    this._open();
  }

  /** The transport in use, or being tried: "websocket" | "sse". */
  get transport() {
    return this._transports[this._ti];
  }

  /** "connecting" | "open" | "reconnecting" | "closed". */
  get state() {
    return this._state;
  }

  _buildUrl(url) {
    const names = Object.keys(this._headers);
    const inQuery = names.length && !this._canSendHeaders;
    if (inQuery && !this.options.headersAsQuery) {
      throw new TypeError(
        `this WebSocket cannot send headers (${names.join(", ")}): pass options.WebSocket ` +
          "(e.g. the `ws` package) or set headersAsQuery: true (the server must read them from the URL)",
      );
    }
    const refresh = Boolean(this.options.getToken || this.options.getSubscriptionToken);
    if (!inQuery && !this.options.keepalive && !refresh) return url;
    const u = new URL(url);
    if (inQuery) for (const n of names) u.searchParams.set(n.toLowerCase(), this._headers[n]);
    // in the query whatever the WebSocket: every runtime can send it, and the server reads it there
    if (this.options.keepalive) u.searchParams.set(KEEPALIVE_QUERY, "1");
    if (refresh) u.searchParams.set(REFRESH_QUERY, "1");
    return u.toString();
  }

  // a message goes out now (else it is queued): open, and not switching transports
  // (while the websocket that replaces the fallback opens, the state stays "open")
  _canSend() {
    return this._state === "open" && this._ws !== null && this._ws.readyState === 1;
  }

  _setState(state, extra = {}) {
    if (this._state === state) return;
    this._state = state;
    this.dispatchEvent(new CustomEvent("statechange", { detail: { state, ...extra } }));
  }

  // connection -------------------------------------------------------------------

  _newWebSocket(url = this.url, headers = this._headers) {
    return this._canSendHeaders
      ? new this._WebSocket(url, this._protocols, { headers })
      : new this._WebSocket(url, this._protocols);
  }

  // the timeout of one attempt: a websocket with a fallback after it gets websocketTimeout
  _attemptTimeout() {
    const o = this.options;
    const fallbackNext = this.transport === "websocket" && this._ti + 1 < this._transports.length;
    return fallbackNext ? Math.min(o.connectTimeout, o.websocketTimeout) : o.connectTimeout;
  }

  _open() {
    if (this.options.getToken && this._token === undefined) {
      // a fresh token for every connection, asked first
      Promise.resolve()
        .then(() => this.options.getToken())
        .then(
          (token) => {
            this._token = String(token);
            if (!this._closedByUser) this._open();
          },
          (err) => this._failed(new JugglerError(`getToken failed: ${err && err.message}`, { cause: err })),
        );
      return;
    }
    const [url, headers] = this._withToken();
    let ws;
    try {
      ws = this.transport === "sse"
        ? new FallbackSocket(url, { headers: this._canSendHeaders ? headers : {}, fetch: this.options.fetch, protocol: SUBPROTOCOL })
        : this._newWebSocket(url, headers);
    } catch (err) {
      this._failed(err);
      return;
    }
    this._ws = ws;
    let opened = false;
    // this socket's keepalive: armed by the first KEEPALIVE, which says the server's interval
    const watch = { limit: 0, last: clock(), timer: null, check: null };
    this._watch = watch;
    const timeout = this._attemptTimeout();
    const guard = setTimeout(() => {
      if (!opened) {
        try {
          ws.close();
        } catch {
          /* ignore */
        }
        onGone(new JugglerError(`connect timeout after ${timeout} ms`));
      }
    }, timeout);
    let gone = false;
    const onGone = (err) => {
      clearTimeout(guard);
      clearTimeout(watch.timer);
      if (gone) return;
      gone = true;
      if (this._ws === ws) this._ws = null;
      detach(ws);
      if (opened) this._lost(err);
      else this._failed(err);
    };
    ws.onopen = () => {
      clearTimeout(guard);
      if (ws.protocol !== SUBPROTOCOL && this._protocols.includes(SUBPROTOCOL)) {
        onGone(new JugglerError(`server did not negotiate ${SUBPROTOCOL} (got "${ws.protocol}")`));
        ws.close();
        return;
      }
      opened = true;
      this._opened();
    };
    watch.check = () => {
      watch.timer = null;
      if (gone || this._ws !== ws) return;
      const idle = clock() - watch.last;
      if (idle < watch.limit) {
        watch.timer = setTimeout(watch.check, watch.limit - idle);
        return;
      }
      // a silent server answers no closing handshake either: forget the socket now
      try {
        ws.close();
      } catch {
        /* ignore */
      }
      onGone(new ConnectionLostError(`nothing from the server for ${Math.round(idle)} ms: connection considered dead`));
    };
    ws.onmessage = (ev) => {
      watch.last = clock();
      this._onMessage(ev.data, watch);
    };
    ws.onerror = noop; // the close event follows and says more
    ws.onclose = (ev) => {
      onGone(new ConnectionLostError(`connection closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`));
    };
  }

  _withToken() {
    // the URL and headers of one connection: with the token getToken gave for it
    const token = this._token;
    this._token = undefined;
    return this._tokenized(token);
  }

  _tokenized(token) {
    // the URL and headers carrying `token` (none: as given)
    if (token === undefined) return [this.url, this._headers];
    if (this._canSendHeaders) return [this.url, { ...this._headers, Authorization: `Bearer ${token}` }];
    const u = new URL(this.url);
    u.searchParams.set(this.options.tokenParam, token);
    return [u.toString(), this._headers];
  }

  _renew(get, type, payload, what) {
    // a token is expiring: a new one from the application, sent to the server
    Promise.resolve()
      .then(get)
      .then((token) => {
        if (token === null || token === undefined || this._closedByUser) return undefined;
        return this._request(type, { ...payload, token: String(token) }, what, this.options.timeout, {
          ms: Math.floor(this.options.timeout),
        });
      })
      .catch((err) => this.dispatchEvent(new CustomEvent("error", { detail: { error: err } })));
  }

  _opened() {
    this._attempt = 0;
    if (this._ti > 0) this._scheduleProbe();
    this._setState("open");
    this.dispatchEvent(new Event("open"));
    // restore subscriptions first, then whatever waited for the connection
    for (const sub of this._subs.values()) this._sendSub(sub);
    const queued = this._queue;
    this._queue = [];
    for (const id of queued) {
      const p = this._pending.get(id);
      if (p && !p.sent) this._transmit(id, p);
    }
    if (this._resolveFirst) {
      this._resolveFirst();
      this._resolveFirst = this._rejectFirst = null;
    }
  }

  _failed(err) {
    // a connection attempt failed: the next transport at once, if there is one
    if (this._ti + 1 < this._transports.length && !this._closedByUser) {
      this._ti += 1;
      this.dispatchEvent(new CustomEvent("fallback", { detail: { transport: this.transport, error: err } }));
      this._open();
      return;
    }
    this._ti = 0; // every transport failed: the next attempt starts again from the first
    if (this._rejectFirst) {
      // the first connection: report it to connect() rather than retrying blindly
      const reject = this._rejectFirst;
      this._resolveFirst = this._rejectFirst = null;
      this._shutdown(new ConnectionClosedError(`cannot connect to ${this.url}: ${err.message || err}`));
      reject(new ConnectionClosedError(`cannot connect to ${this.url}: ${err.message || err}`, { cause: err }));
      return;
    }
    this._scheduleReconnect(err);
  }

  _lost(err) {
    // an open connection dropped: what was sent on it can no longer get an answer
    for (const [id, p] of this._pending) {
      if (p.sent) {
        this._settle(id, p, new ConnectionLostError(`connection lost before the answer to ${p.what}`));
      }
    }
    for (const sub of this._subs.values()) sub.acked = false;
    this.dispatchEvent(new CustomEvent("close", { detail: { error: err } }));
    if (this._closedByUser) return;
    this._scheduleReconnect(err);
  }

  _scheduleReconnect(err) {
    const o = this.options;
    if (this._closedByUser) return;
    if (!o.reconnect || this._attempt >= o.maxAttempts) {
      this._shutdown(new ConnectionClosedError(`connection lost and not reconnecting: ${err && err.message}`));
      return;
    }
    const base = Math.min(o.maxDelay, o.initialDelay * Math.pow(o.factor, this._attempt));
    const delay = Math.round(base * (1 - o.jitter * Math.random()));
    this._attempt += 1;
    this._setState("reconnecting", { attempt: this._attempt, delay });
    this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
    this._timer = setTimeout(() => {
      this._timer = null;
      if (!this._closedByUser) this._open();
    }, delay);
  }

  // back to the websocket -------------------------------------------------------------

  _scheduleProbe() {
    clearTimeout(this._probeTimer);
    this._probeTimer = null;
    const every = this.options.websocketRetry;
    if (every > 0 && this._transports[0] === "websocket") this._probeTimer = setTimeout(() => this._probe(), every);
  }

  // on the fallback: does a websocket open now? (its own short-lived socket, closed at once)
  _probe() {
    this._probeTimer = null;
    if (this._closedByUser || this._ti === 0 || this._state !== "open") return;
    if (this.options.getToken) {
      // the probe needs a token as much as a connection does (else the server's 401 looks like a refusal)
      Promise.resolve()
        .then(() => this.options.getToken())
        .then((token) => this._probeWith(...this._tokenized(String(token))), () => this._scheduleProbe());
      return;
    }
    this._probeWith(this.url, this._headers);
  }

  _probeWith(url, headers) {
    if (this._closedByUser || this._ti === 0 || this._state !== "open") return;
    let ws;
    try {
      ws = this._newWebSocket(url, headers);
    } catch {
      this._scheduleProbe();
      return;
    }
    let settled = false;
    const done = (ok) => {
      if (settled) return;
      settled = true;
      clearTimeout(t);
      detach(ws);
      try {
        ws.close(1000);
      } catch {
        /* ignore */
      }
      if (ok) this._upgrade();
      else this._scheduleProbe();
    };
    const t = setTimeout(() => done(false), this.options.websocketTimeout);
    ws.onopen = () => done(ws.protocol === SUBPROTOCOL || !this._protocols.includes(SUBPROTOCOL));
    ws.onclose = () => done(false);
  }

  // the websocket opens again: switch to it once nothing waits for an answer on the fallback
  _upgrade() {
    this._upgradeTimer = null;
    if (this._closedByUser || this._ti === 0 || this._state !== "open" || !this._ws) return;
    for (const p of this._pending.values()) {
      if (p.sent) {
        this._upgradeTimer = setTimeout(() => this._upgrade(), 50);
        return;
      }
    }
    const old = this._ws;
    this._ws = null;
    if (this._watch) clearTimeout(this._watch.timer);
    detach(old);
    try {
      old.close(1000);
    } catch {
      /* ignore */
    }
    for (const sub of this._subs.values()) sub.acked = false;
    this._ti = 0;
    this._open(); // messages made meanwhile are queued; subscriptions are restored with recovery
  }

  /** Close for good: pending calls reject with ConnectionClosedError. Idempotent. */
  close() {
    if (this._closedByUser) return;
    this._closedByUser = true;
    clearTimeout(this._probeTimer);
    clearTimeout(this._upgradeTimer);
    const ws = this._ws;
    this._ws = null;
    if (this._watch) clearTimeout(this._watch.timer);
    if (ws) {
      detach(ws);
      try {
        ws.close(1000);
      } catch {
        /* ignore */
      }
    }
    this._shutdown(new ConnectionClosedError("client closed"));
    if (this._rejectFirst) {
      this._rejectFirst(new ConnectionClosedError("client closed before connecting"));
      this._resolveFirst = this._rejectFirst = null;
    }
  }

  _shutdown(err) {
    this._closedByUser = true;
    if (this._timer) clearTimeout(this._timer);
    this._timer = null;
    for (const [id, p] of this._pending) this._settle(id, p, err);
    this._queue = [];
    for (const sub of this._subs.values()) {
      if (!sub.acked) sub.rejectReady(err);
    }
    this._subs.clear();
    this._setState("closed");
  }

  // sending ----------------------------------------------------------------------

  _request(type, payload, what, timeout, extra = {}) {
    if (this._closedByUser) return Promise.reject(new ConnectionClosedError("client closed"));
    const ms = checkTimeout(timeout);
    const id = uuid4();
    let frame;
    try {
      // serialized now: later changes to `args` do not leak into a queued message
      frame = JSON.stringify({ meta: { type, uuid: id }, payload });
    } catch (err) {
      return Promise.reject(err); // e.g. a BigInt or a cycle in args
    }
    return new Promise((resolve, reject) => {
      const p = { type, payload, frame, what, resolve, reject, sent: false, timer: null, ...extra };
      p.timer = setTimeout(() => this._expire(id), ms);
      this._pending.set(id, p);
      if (this._canSend()) {
        this._transmit(id, p);
      } else if (this._queue.length >= this.options.maxQueue) {
        this._settle(id, p, new JugglerError(`send queue full (${this.options.maxQueue} messages)`));
      } else {
        this._queue.push(id);
      }
    });
  }

  _transmit(id, p) {
    p.sent = true;
    try {
      this._ws.send(p.frame);
    } catch (err) {
      this._settle(id, p, new ConnectionLostError(`cannot send ${p.what}: ${err.message || err}`, { cause: err }));
    }
  }

  _expire(id) {
    const p = this._pending.get(id);
    if (!p) return;
    this._settle(id, p, new ExpiredError(p.what, p.ms, id));
  }

  _settle(id, p, err, value) {
    this._pending.delete(id);
    clearTimeout(p.timer);
    if (!p.sent) {
      const i = this._queue.indexOf(id);
      if (i >= 0) this._queue.splice(i, 1);
    }
    if (err) p.reject(err);
    else p.resolve(value);
  }

  /**
   * Call `uri` with `args` (any JSON value; undefined = none). Resolves with the
   * result; a callee error arrives as a result ({error: {message}}), as on the wire.
   */
  call(uri, args, { timeout = this.options.timeout } = {}) {
    let ms;
    try {
      ms = checkTimeout(timeout);
    } catch (err) {
      return Promise.reject(err);
    }
    const payload = { uri: String(uri), timeout: ms * 1e6 };
    if (args !== undefined) payload.args = args;
    return this._request(CALL, payload, `call ${uri}`, ms, { ms, acked: false });
  }

  /** Publish `args` on `channel`; resolves when the server ACKs it. */
  publish(channel, args, { timeout = this.options.timeout } = {}) {
    const payload = { channel: String(channel) };
    if (args !== undefined) payload.args = args;
    try {
      checkTimeout(timeout);
    } catch (err) {
      return Promise.reject(err);
    }
    return this._request(PUB, payload, `publish ${channel}`, timeout, { ms: Math.floor(timeout) });
  }

  /**
   * Subscribe `handler(args, event)` to `channel` (a Redis glob when `pattern`).
   * Returns the unsubscribe function (async, idempotent) with a `ready` promise
   * that settles on the server's ACK/NACK. Subscriptions survive reconnections.
   * `onJoin(info, event)` / `onLeave(info, event)` ask for the channel's
   * join/leave notices (channels with presence and join_leave on the server).
   */
  subscribe(channel, handler, { pattern = false, timeout = this.options.timeout, onJoin, onLeave } = {}) {
    if (typeof handler !== "function") throw new TypeError("handler must be a function");
    for (const [name, cb] of [["onJoin", onJoin], ["onLeave", onLeave]]) {
      if (cb !== undefined && typeof cb !== "function") throw new TypeError(`${name} must be a function`);
    }
    if (this._closedByUser) throw new ConnectionClosedError("client closed");
    channel = String(channel);
    pattern = Boolean(pattern);
    const key = subKey(channel, pattern);
    const notices = !pattern && Boolean(onJoin || onLeave);
    let sub = this._subs.get(key);
    if (!sub) {
      sub = { key, channel, pattern, handlers: new Set(), acked: false, timeout, everAcked: false, joinLeave: notices };
      sub.ready = new Promise((resolve, reject) => {
        sub.resolveReady = resolve;
        sub.rejectReady = reject;
      });
      sub.ready.catch(() => {});
      this._subs.set(key, sub);
      if (this._canSend()) this._sendSub(sub);
    }
    const entry = { handler, onJoin, onLeave };
    sub.handlers.add(entry);
    if (notices && !sub.joinLeave) {
      // a subscription made without asking for the notices: ask now
      sub.joinLeave = true;
      if (this._canSend()) this._sendSub(sub);
    }
    let done = false;
    const unsubscribe = async () => {
      if (done) return;
      done = true;
      sub.handlers.delete(entry);
      if (sub.handlers.size || this._subs.get(key) !== sub) return;
      this._subs.delete(key);
      if (this._closedByUser || this._state !== "open") return; // nothing to undo on the server
      try {
        await this._request(UNSB, { channel, pattern }, `unsubscribe ${channel}`, timeout, {
          ms: Math.floor(timeout),
        });
      } catch (err) {
        // a lost connection took the subscription with it
        if (!(err instanceof ConnectionLostError || err instanceof ConnectionClosedError)) throw err;
      }
    };
    unsubscribe.ready = sub.ready;
    return unsubscribe;
  }

  _sendSub(sub, token) {
    const get = this.options.getSubscriptionToken;
    if (get && token === undefined) {
      // the subscription token first (null: the channel needs none)
      Promise.resolve()
        .then(() => get(sub.channel))
        .then(
          (t) => {
            if (this._subs.get(sub.key) === sub && this._state === "open" && this._ws) this._sendSub(sub, t ?? null);
          },
          (err) => {
            if (this._subs.get(sub.key) === sub && !sub.everAcked) {
              this._subs.delete(sub.key);
              sub.rejectReady(err);
            }
            this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
          },
        );
      return;
    }
    const payload = { channel: sub.channel, pattern: sub.pattern };
    if (token !== undefined && token !== null) payload.token = String(token);
    // a channel with history: ask for what was missed since the last event seen
    if (sub.position) payload.since = { offset: sub.position.offset, epoch: sub.position.epoch };
    if (sub.joinLeave) payload.join_leave = true;
    const p = this._request(SUB, payload, `subscribe ${sub.channel}`, sub.timeout, { ms: Math.floor(sub.timeout) });
    p.then(
      (ack) => {
        sub.resolveReady(); // also when unsubscribed meanwhile: it did take effect
        if (this._subs.get(sub.key) === sub) sub.acked = sub.everAcked = true;
        if (ack && typeof ack.epoch === "string" && !sub.pattern) {
          if (ack.recovered === false) this._unrecovered(sub);
          if (!sub.position || ack.recovered === false || sub.position.epoch !== ack.epoch) {
            sub.position = { offset: ack.offset ?? 0, epoch: ack.epoch };
          }
        }
      },
      (err) => {
        if (err instanceof NackError && this._subs.get(sub.key) === sub) {
          // refused: the handlers will never hear anything
          this._subs.delete(sub.key);
          sub.rejectReady(err);
          this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
        } else if (!sub.everAcked && !(err instanceof ConnectionLostError)) {
          sub.rejectReady(err);
        }
        // ConnectionLostError: re-sent on the next connection
      },
    );
  }

  /**
   * A channel's kept publications (a HISTORY request): resolves with
   * {events, offset, epoch[, recovered]}, each event shaped as an EVNT payload
   * ({for, channel, args, offset, epoch}). `limit`: at most that many (0: the
   * position only); `since` {offset, epoch}: only those after it, `recovered`
   * saying whether none is missing. Rejects with NackError where not allowed.
   */
  history(channel, { limit, since, timeout = this.options.timeout } = {}) {
    const payload = { channel: String(channel) };
    if (limit !== undefined) payload.limit = limit;
    if (since !== undefined) payload.since = { offset: since.offset, epoch: since.epoch };
    try {
      checkTimeout(timeout);
    } catch (err) {
      return Promise.reject(err);
    }
    return this._request(HISTORY, payload, `history ${channel}`, timeout, { ms: Math.floor(timeout) });
  }

  /** Who is subscribed to `channel` (a PRESENCE request): {clientId: {client, user[, conn_info]}}. */
  async presence(channel, { timeout = this.options.timeout } = {}) {
    const result = await this._request(PRESENCE, { channel: String(channel) }, `presence ${channel}`, timeout, {
      ms: Math.floor(timeout),
    });
    return (result && result.presence) || {};
  }

  _serverPublication(pl) {
    // an EVNT of a channel this client never subscribed to: a server-side subscription
    if (pl.pattern !== undefined || pl.join !== undefined || pl.leave !== undefined || pl.recovered === false) return;
    const ev = { channel: pl.channel, uuid: pl.for, args: pl.args ?? null, offset: pl.offset, epoch: pl.epoch };
    if (typeof pl.offset === "number" && typeof pl.epoch === "string") {
      // where to ask history(channel, {since}) from after a reconnection
      this.serverPositions.set(pl.channel, { offset: pl.offset, epoch: pl.epoch });
    }
    const cb = this.options.onServerPublication;
    if (typeof cb === "function") {
      try {
        cb(ev.args, ev);
      } catch (err) {
        this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
      }
    }
    this.dispatchEvent(new CustomEvent("publication", { detail: ev }));
  }

  _unrecovered(sub) {
    // the application reloads its state: what it missed is gone
    this.dispatchEvent(new CustomEvent("unrecovered", { detail: { channel: sub.channel } }));
  }

  // receiving --------------------------------------------------------------------

  _onMessage(data, watch) {
    if (typeof data !== "string") {
      if (data instanceof ArrayBuffer) data = new TextDecoder().decode(data);
      else if (ArrayBuffer.isView(data)) data = new TextDecoder().decode(data);
      else data = String(data);
    }
    let msg;
    try {
      msg = JSON.parse(data);
    } catch (err) {
      this.dispatchEvent(new CustomEvent("error", { detail: { error: new JugglerError("invalid JSON from server", { cause: err }) } }));
      return;
    }
    const type = msg && msg.meta && msg.meta.type;
    const pl = (msg && msg.payload) || {};
    switch (type) {
      case ACK: {
        const p = this._pending.get(pl.for);
        if (!p) return;
        if (p.type === CALL) p.acked = true; // queued; the RES settles it
        else this._settle(pl.for, p, null, p.type === SUB ? pl : undefined);
        return;
      }
      case NACK: {
        const p = this._pending.get(pl.for);
        if (p) this._settle(pl.for, p, new NackError(pl));
        return;
      }
      case RES: {
        const p = this._pending.get(pl.for);
        if (p && p.type === CALL) this._settle(pl.for, p, null, pl.args === undefined ? null : pl.args);
        return; // else: late (expired locally) — ignored
      }
      case EVNT: {
        const key = pl.pattern !== undefined ? subKey(pl.pattern, true) : subKey(pl.channel, false);
        const sub = this._subs.get(key);
        if (!sub) {
          this._serverPublication(pl);
          return;
        }
        if (pl.join !== undefined || pl.leave !== undefined) {
          // a join/leave notice: to the handlers that asked for them
          const join = pl.join !== undefined;
          const ev = { channel: pl.channel, [join ? "join" : "leave"]: join ? pl.join : pl.leave };
          for (const entry of [...sub.handlers]) {
            const cb = join ? entry.onJoin : entry.onLeave;
            if (!cb) continue;
            try {
              cb(join ? pl.join : pl.leave, ev);
            } catch (err) {
              this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
            }
          }
          return;
        }
        if (pl.recovered === false) {
          // a notice: events of this channel were lost and cannot be recovered
          sub.position = { offset: pl.offset ?? 0, epoch: pl.epoch ?? "" };
          this._unrecovered(sub);
          return;
        }
        if (typeof pl.offset === "number" && typeof pl.epoch === "string" && pl.pattern === undefined) {
          const seen = sub.position;
          if (seen && seen.epoch === pl.epoch && pl.offset <= seen.offset) return; // already delivered
          sub.position = { offset: pl.offset, epoch: pl.epoch };
        }
        const ev = { channel: pl.channel, pattern: pl.pattern, uuid: pl.for, args: pl.args ?? null,
          offset: pl.offset, epoch: pl.epoch };
        for (const { handler } of [...sub.handlers]) {
          try {
            handler(ev.args, ev);
          } catch (err) {
            // one bad handler must not starve the others nor kill the connection
            this.dispatchEvent(new CustomEvent("error", { detail: { error: err } }));
          }
        }
        return;
      }
      case REPLY: {
        // the answer to an extension request (sent with _request, type 256 and above)
        const p = this._pending.get(pl.for);
        if (p && p.type >= 256) this._settle(pl.for, p, null, pl.result === undefined ? null : pl.result);
        return;
      }
      case EXPIRING: {
        // a token expires in pl.expires_in_ms: the connection's, or a subscription's (pl.channel)
        const o = this.options;
        if (typeof pl.channel !== "string") {
          if (o.getToken) this._renew(() => o.getToken(), REFRESH, {}, "refresh");
          return;
        }
        const key = subKey(pl.channel, pl.pattern === true);
        if (pl.unsubscribed === true) {
          // the server ended the subscription: its token was not renewed in time
          if (this._subs.has(key)) this._subs.delete(key);
          this.dispatchEvent(new CustomEvent("subscriptionend", {
            detail: { channel: pl.channel, pattern: pl.pattern === true },
          }));
          return;
        }
        if (o.getSubscriptionToken && this._subs.has(key)) {
          const payload = { channel: pl.channel };
          if (pl.pattern === true) payload.pattern = true;
          this._renew(() => o.getSubscriptionToken(pl.channel), SUB_REFRESH, payload, `refresh ${pl.channel}`);
        }
        return;
      }
      case KEEPALIVE: {
        // the server is alive (any message says so); the first one arms the watch
        const ms = keepaliveInterval(pl);
        if (!ms || !watch || !this.options.keepalive) return;
        watch.limit = ms + this.options.keepaliveGrace;
        if (!watch.timer) watch.timer = setTimeout(watch.check, watch.limit);
        return;
      }
      default:
        return; // unknown server types are ignored (forward compatibility)
    }
  }
}

export default Juggler;
