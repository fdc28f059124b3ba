// The juggler.0 vocabulary of juggler.js: message types (the protocol's and
// this server's extensions), handshake query parameters, the errors the
// client raises, message ids. juggler.js re-exports what is public.

export const CALL = 1, PUB = 2, SUB = 3, UNSB = 4, NACK = 7, ACK = 8, RES = 9, EVNT = 10, KEEPALIVE = 256;
// the server's answer to an extension request (types 256 and above): {for, for_type, result}
export const REPLY = 262;
// token refresh: a new connection token (c→s), "your token expires" (s→c), a new subscription token (c→s)
export const REFRESH = 257, EXPIRING = 258, SUB_REFRESH = 259;
// client requests for a channel's history and presence (answered with REPLY where the server allows them)
export const HISTORY = 260, PRESENCE = 261;
export const SUBPROTOCOL = "juggler.0";
export const MessageType = Object.freeze({
  CALL, PUB, SUB, UNSB, NACK, ACK, RES, EVNT, KEEPALIVE, REFRESH, EXPIRING, SUB_REFRESH, HISTORY, PRESENCE, REPLY,
});
// the query parameter that asks the server for EXPIRING messages
export const REFRESH_QUERY = "juggler-refresh";
// the query parameter that asks the server for KEEPALIVE messages (browsers cannot send headers)
export const KEEPALIVE_QUERY = "juggler-keepalive";

// errors ----------------------------------------------------------------------

/** Root of every error this module raises. */
export class JugglerError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The server refused a message (NACK): `code` (500 = broker error: not done; 504 = outcome unknown: a CALL
 * may have been queued, a PUB published, so do not blindly retry; 401/403 …), `message`. */
export class NackError extends JugglerError {
  constructor(payload) {
    super(`NACK ${payload.code}: ${payload.message}`);
    this.code = payload.code;
    this.serverMessage = payload.message;
    this.forType = payload.for_type;
    this.for = payload.for;
    this.uri = payload.uri;
    this.channel = payload.channel;
  }
}

/**
 * No answer within the timeout (the original client's local "EXP"): a call got
 * no RES, or a publish/subscribe/unsubscribe no ACK. A late answer is ignored.
 */
export class ExpiredError extends JugglerError {
  constructor(what, timeout, uuid) {
    super(`${what}: no answer after ${timeout} ms`);
    this.timeout = timeout;
    this.uuid = uuid;
  }
}

/** The connection dropped while a message was in flight (it may or may not have run). */
export class ConnectionLostError extends JugglerError {}

/** The client was closed (close()), or could not connect at all. */
export class ConnectionClosedError extends JugglerError {}

// a message's uuid (v4)
export function uuid4() {
  const c = globalThis.crypto;
  // randomUUID only exists in secure contexts; getRandomValues everywhere
  if (c && typeof c.randomUUID === "function") return c.randomUUID();
  const b = new Uint8Array(16);
  if (c && typeof c.getRandomValues === "function") c.getRandomValues(b);
  else for (let i = 0; i < 16; i++) b[i] = Math.floor(Math.random() * 256); // ids need uniqueness, not secrecy
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// the interval (ms) a KEEPALIVE's payload announces, or 0 when it has no usable one
export function keepaliveInterval(pl) {
  const ms = pl && pl.interval_ms;
  return Number.isSafeInteger(ms) && ms > 0 ? ms : 0;
}
