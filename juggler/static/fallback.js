// juggler's HTTP fallback transport, for juggler.js: the server's SSE stream
// and POSTs as a WebSocket-like object. juggler.js uses it when websockets are
// refused or blocked (its `transports` option); the wire is described in the
// manual ("HTTP fallback transport"). No dependencies; served beside juggler.js.

// a monotonic clock (ms): a wall clock set back must not look like a lost stream
const clock =
  globalThis.performance && typeof globalThis.performance.now === "function"
    ? () => globalThis.performance.now()
    : () => Date.now();

const FALLBACK_BATCH = 100; // messages in one POST of the fallback, at most

// the HTTP fallback ---------------------------------------------------------------

/**
 * The server's HTTP fallback as a WebSocket-like object (onopen, onmessage,
 * onclose, send, close): one SSE stream read with fetch (each event one
 * server message; the first one says the session id) and POSTs of the
 * messages sent, one POST in flight at a time so they stay in order. A
 * stream that drops is reopened with the session id and Last-Event-ID
 * within the server's grace period, and what was missed is replayed;
 * events seen twice are skipped by their id.
 */
export class FallbackSocket {
  constructor(url, { headers = {}, fetch, protocol = "juggler.0" } = {}) {
    const u = new URL(url);
    u.protocol = u.protocol === "wss:" ? "https:" : "http:";
    this._base = u.origin + u.pathname.replace(/\/+$/, "");
    this._params = u.searchParams;
    this._headers = headers;
    this._fetch = fetch || globalThis.fetch.bind(globalThis);
    this.protocol = protocol;
    this.readyState = 0; // CONNECTING, OPEN = 1, CLOSED = 3 (as a WebSocket)
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    this._session = "";
    this._lastId = 0;
    this._graceMs = 0;
    this._lostAt = 0;
    this._out = [];
    this._posting = false;
    this._done = false;
    this._abort = new AbortController();
    setTimeout(() => this._stream(false), 0);
  }

  _url(kind, extra) {
    const q = new URLSearchParams(this._params);
    for (const [k, v] of Object.entries(extra)) q.set(k, v);
    const qs = q.toString();
    return `${this._base}/${kind}${qs ? "?" + qs : ""}`;
  }

  _request(init) {
    return { credentials: "include", cache: "no-store", signal: this._abort.signal, ...init };
  }

  async _stream(resume) {
    if (this._done) return;
    const headers = { ...this._headers };
    if (resume) headers["Last-Event-ID"] = String(this._lastId);
    let res;
    try {
      res = await this._fetch(this._url("sse", resume ? { session: this._session } : {}), this._request({ headers }));
    } catch (err) {
      this._dropped(err);
      return;
    }
    if (!res.ok || !res.body) {
      // refused (401, 403, 404 …) or the session is gone (404, 410): no retrying this stream
      this._end(1006, `fallback stream refused: HTTP ${res.status}`);
      return;
    }
    this._lostAt = 0;
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let name = "message", id = null, data = [];
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        const lines = buf.split(/\r\n|\r|\n/);
        buf = lines.pop();
        for (const line of lines) {
          if (line === "") {
            if (data.length) this._dispatch(name, id, data.join("\n"));
            name = "message";
            id = null;
            data = [];
            if (this._done) return;
          } else if (line[0] !== ":") {
            const i = line.indexOf(":");
            const field = i < 0 ? line : line.slice(0, i);
            let v = i < 0 ? "" : line.slice(i + 1);
            if (v[0] === " ") v = v.slice(1);
            if (field === "data") data.push(v);
            else if (field === "event") name = v;
            else if (field === "id") id = v;
          }
        }
      }
      this._dropped(new Error("the stream ended"));
    } catch (err) {
      this._dropped(err);
    }
  }

  _dispatch(name, id, data) {
    if (name === "session") {
      let info = {};
      try {
        info = JSON.parse(data);
      } catch {
        /* ignored: the session stays unknown, POSTs fail */
      }
      this._session = String(info.session || "");
      this._graceMs = Number(info.grace_ms) || 0;
      if (this.readyState === 0) {
        this.readyState = 1;
        if (this.onopen) this.onopen({});
      }
      return;
    }
    if (name === "close") {
      let info = {};
      try {
        info = JSON.parse(data);
      } catch {
        /* a close all the same */
      }
      this._end(Number(info.code) || 1006, String(info.reason || ""));
      return;
    }
    if (name !== "message") return;
    if (id !== null) {
      const n = Number(id);
      if (n <= this._lastId) return; // replayed after a reopened stream: seen already
      this._lastId = n;
    }
    if (this.onmessage) this.onmessage({ data });
  }

  _dropped(err) {
    if (this._done) return;
    if (this.readyState !== 1 || !this._session) {
      this._end(1006, `fallback stream failed: ${(err && err.message) || err}`);
      return;
    }
    // reopen it within the server's grace: the session and its subscriptions live on
    if (!this._lostAt) this._lostAt = clock();
    if (clock() - this._lostAt >= this._graceMs) {
      this._end(1006, "fallback stream lost");
      return;
    }
    setTimeout(() => this._stream(true), Math.min(250, this._graceMs / 4));
  }

  send(text) {
    if (this.readyState !== 1) throw new Error("the fallback session is not open");
    this._out.push(text);
    this._pump();
  }

  async _pump() {
    if (this._posting || !this._out.length || this._done) return;
    this._posting = true;
    // at most FALLBACK_BATCH messages a POST (the server takes up to its max_pending, 1024 by default)
    const lines = this._out.splice(0, FALLBACK_BATCH);
    let res;
    try {
      res = await this._fetch(this._url("send", { session: this._session }), this._request({
        method: "POST", body: lines.join("\n"), headers: { "Content-Type": "text/plain", ...this._headers },
      }));
    } catch (err) {
      this._end(1006, `fallback POST failed: ${(err && err.message) || err}`);
      return;
    } finally {
      this._posting = false;
    }
    if (res.status === 429) {
      // the session has too much queued: the same messages again, in order, a little later
      this._out = lines.concat(this._out);
      this._posting = true;
      setTimeout(() => {
        this._posting = false;
        this._pump();
      }, 1000);
      return;
    }
    if (!res.ok) {
      this._end(1006, `fallback POST refused: HTTP ${res.status}`);
      return;
    }
    this._pump();
  }

  close() {
    if (this._done) return;
    const leaving = this.readyState === 1 && this._session;
    this._done = true;
    this.readyState = 3;
    this._abort.abort();
    if (leaving) {
      // tell the server, so that it does not keep the session for its grace period
      // (keepalive: the request outlives a page being closed)
      this._fetch(this._url("send", { session: this._session, close: "1" }), {
        method: "POST", body: "", headers: { "Content-Type": "text/plain", ...this._headers },
        credentials: "include", cache: "no-store", keepalive: true,
      }).catch(() => {});
    }
  }

  _end(code, reason) {
    if (this._done) return;
    this._done = true;
    this.readyState = 3;
    this._abort.abort(); // the server ended the session (or it is lost): nothing to tell it
    if (this.onclose) this.onclose({ code, reason });
  }
}

// the client --------------------------------------------------------------------

/**
 * A juggler.0 connection that reconnects by itself. Create it with
 * `await Juggler.connect(url, options)`. It is an EventTarget: "statechange"
 * (detail: {state, attempt, delay}), "open", "close", "error" (detail: {error}).
 */
