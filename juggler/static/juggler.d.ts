// Type declarations of juggler.js, the browser (and Node) client of juggler.0.
// Served next to it by the juggler server at /juggler.d.ts.

/** Any JSON value (call arguments, results, event arguments). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export declare const SUBPROTOCOL: "juggler.0";

export declare const MessageType: Readonly<{
  CALL: 1; PUB: 2; SUB: 3; UNSB: 4; NACK: 7; ACK: 8; RES: 9; EVNT: 10;
  /** This server's extension, sent only to clients that ask (`keepalive`): `{interval_ms}`. */
  KEEPALIVE: 256;
  /** Extensions of token refresh: a new connection token (`{token}`), sent by the client. */
  REFRESH: 257;
  /** Sent to clients that ask (`getToken`/`getSubscriptionToken`): `{expires_in_ms[, channel, pattern, unsubscribed]}`. */
  EXPIRING: 258;
  /** A new subscription token (`{channel, token[, pattern]}`), sent by the client. */
  SUB_REFRESH: 259;
  /** Client requests for a channel's history and presence (see history(), presence()). */
  HISTORY: 260; PRESENCE: 261;
  /** The server's answer to an extension request (REFRESH, SUB_REFRESH, HISTORY, PRESENCE): `{for, for_type, result}`. */
  REPLY: 262;
}>;

export type State = "connecting" | "open" | "reconnecting" | "closed";

/** A constructor compatible with the WHATWG `WebSocket` (or the `ws` package's). */
export interface WebSocketConstructor {
  new (url: string, protocols?: string | string[], options?: { headers?: Record<string, string> }): WebSocket;
}

export interface ConnectOptions {
  /** Subprotocols to offer. Default `["juggler.0"]` (the server refuses others). */
  protocols?: string[];
  /**
   * Handshake request headers, e.g. `Authorization` for a server with an auth
   * middleware.
   *
   * Browsers cannot set websocket handshake headers at all, and Node >= 22's
   * built-in `WebSocket` does not take them either. So headers are only sent
   * when you pass a `WebSocket` constructor that accepts `(url, protocols,
   * {headers})` — the `ws` package does. With the built-in WebSocket, `connect`
   * throws a TypeError, unless `headersAsQuery` is set: then each header is
   * sent as a query parameter of the URL (lower-case name), which works only
   * if the server reads it from there (the juggler server does so for
   * `juggler-allowed-messages`; an auth middleware must opt in for tokens).
   * Query parameters end up in logs: prefer short-lived tokens there.
   */
  headers?: Record<string, string>;
  /** Send `headers` as URL query parameters when the runtime cannot send headers. Default false. */
  headersAsQuery?: boolean;
  /**
   * Message types this connection may send (`Juggler-Allowed-Messages`), e.g.
   * `["call", "pub"]`: the server then needs no pub-sub listener for it. Sent
   * as a header, or as the `juggler-allowed-messages` query parameter with the
   * built-in WebSocket (the server accepts both).
   */
  allowedMessages?: string | string[];
  /** The WebSocket implementation: default `globalThis.WebSocket`; in Node 20 pass `ws`. */
  WebSocket?: WebSocketConstructor;
  /**
   * Treat `WebSocket` as a browser-style constructor that cannot send headers
   * (as `globalThis.WebSocket` always is). Default false when `WebSocket` is given.
   */
  nativeWebSocket?: boolean;
  /** Default timeout of calls, publishes and subscriptions, in ms. Default 60000. */
  timeout?: number;
  /** Max ms for one connection attempt. Default 10000. */
  connectTimeout?: number;
  /** Reconnect after the connection drops. Default true. */
  reconnect?: boolean;
  /** First reconnection delay, ms. Default 250. */
  initialDelay?: number;
  /** Backoff cap, ms. Default 10000. */
  maxDelay?: number;
  /** Backoff multiplier. Default 2. */
  factor?: number;
  /** Each delay is scaled by a random factor in [1 - jitter, 1]. Default 0.5. */
  jitter?: number;
  /** Consecutive failed reconnection attempts before giving up (state "closed"). Default Infinity. */
  maxAttempts?: number;
  /** Messages queued while disconnected before further ones fail. Default 1000. */
  maxQueue?: number;
  /**
   * Ask the server for KEEPALIVE messages (the `juggler-keepalive=1` query
   * parameter, added to `url`). A browser cannot see websocket pings, so this
   * is how the client tells a dead server from a quiet one: once the server
   * has announced its ping interval, a connection on which nothing arrives for
   * that interval plus `keepaliveGrace` is dropped and reconnected like any
   * lost connection. A server that sends none (the original Go server, or
   * pings off) is waited for as before. Default true.
   */
  keepalive?: boolean;
  /** Milliseconds past the server's announced interval before its silence counts as death. Default 10000. */
  keepaliveGrace?: number;
  /**
   * The connection's token: asked before every connection (sent as the
   * `tokenParam` query parameter, or the Authorization header when the
   * WebSocket can send headers) and whenever the server says it expires
   * (EXPIRING): the new one renews the live connection (REFRESH). Asking
   * for it adds `juggler-refresh=1` to `url`. Default none.
   */
  getToken?: (() => Promise<string>) | null;
  /**
   * A channel's subscription token (private channels), or null when it needs
   * none: asked before each SUB and when the server says it expires
   * (SUB_REFRESH renews it). A subscription the server ended because its token
   * was not renewed is dropped with a "subscriptionend" event. Default none.
   */
  getSubscriptionToken?: ((channel: string) => Promise<string | null>) | null;
  /** The query parameter carrying the token when headers cannot be sent. Default "token". */
  tokenParam?: string;
  /**
   * Called with the events of server-side subscriptions: channels the server
   * subscribed this connection to (the token's `channels` claim, the server
   * API's `subscribe`), never subscribe()d here. They are also dispatched as
   * the "publication" event (CustomEvent<JugglerEvent>).
   */
  onServerPublication?: EventHandler;
  /**
   * The transports to use, in order of preference. Default `["websocket", "sse"]`:
   * when the websocket is refused (a proxy's 403) or swallowed (no open within
   * `websocketTimeout`), the client goes on at once over the server's HTTP
   * fallback (an SSE stream down, POSTs up, at `<url>/sse` and `<url>/send` over
   * http(s)), and goes back to the websocket when it can. `["sse"]`: the
   * fallback only; `["websocket"]`: never the fallback.
   */
  transports?: Transport[];
  /** Max ms of a websocket attempt when a fallback follows it (else `connectTimeout`). Default 5000. */
  websocketTimeout?: number;
  /**
   * On the fallback, try the websocket again this often (ms), and switch back to
   * it once it opens and no answer is outstanding (subscriptions are restored,
   * with recovery, as on a reconnect). 0: never. Default 30000.
   */
  websocketRetry?: number;
  /** The fetch of the fallback. Default `globalThis.fetch` (with credentials: the balancer's sticky cookie). */
  fetch?: typeof fetch;
}

export interface HistoryOptions {
  /** At most this many publications, oldest first; 0: none (the position only). Default: every one kept. */
  limit?: number;
  /** Only the publications after this position (say, the last event seen). */
  since?: { offset: number; epoch: string };
  /** Milliseconds to wait for the answer. Default: the client's `timeout`. */
  timeout?: number;
}

export interface HistoryEvent {
  /** The uuid of the PUB. */
  for: string;
  channel: string;
  args: Json;
  offset: number;
  epoch: string;
}

export interface HistoryResult {
  events: HistoryEvent[];
  /** The channel's current position. */
  offset: number;
  epoch: string;
  /** With `since`: whether every publication after it is there (false: none is given; reload). */
  recovered?: boolean;
}

/** "websocket", or "sse": the server's HTTP fallback (SSE down, POST up). */
export type Transport = "websocket" | "sse";

export interface CallOptions {
  /** Milliseconds to wait for the result (sent to the server in ns). Default: the client's `timeout`. */
  timeout?: number;
}

export interface SubscribeOptions {
  /** `channel` is a Redis glob pattern (`*`, `?`, `[ab]`). Default false. */
  pattern?: boolean;
  /** Milliseconds to wait for the server's ACK. */
  timeout?: number;
  /**
   * Asks for the channel's join notices (a channel with presence and
   * join_leave on the server; not for patterns): called for each subscriber
   * that joins, this one included.
   */
  onJoin?: PresenceHandler;
  /** Asks for the channel's leave notices: called for each subscriber that leaves. */
  onLeave?: PresenceHandler;
}

/** A subscriber of a channel with presence. */
export interface ClientInfo {
  /** Its connection's id. */
  client: string;
  /** Its user (the token's `sub`), null without authentication. */
  user: string | null;
  /** The token's `info` claim, when it has one. */
  conn_info?: Json;
}

export interface PresenceNotice {
  channel: string;
  join?: ClientInfo;
  leave?: ClientInfo;
}

export type PresenceHandler = (info: ClientInfo, notice: PresenceNotice) => void;

export interface JugglerEvent {
  /** The channel it was published on. */
  channel: string;
  /** The pattern that matched, for pattern subscriptions. */
  pattern?: string;
  /** The uuid of the PUB. */
  uuid: string;
  args: Json;
  /** Its position in the channel's history (channels with history only). */
  offset?: number;
  epoch?: string;
}

export type EventHandler = (args: Json, event: JugglerEvent) => void;

/** Stops this handler; the last handler of a channel sends UNSB. Idempotent. */
export interface Unsubscribe {
  (): Promise<void>;
  /**
   * Resolves when the server ACKed the subscription (events published after
   * that are delivered); rejects with NackError if refused (the handler is then
   * dropped), or ConnectionClosedError if the client closes first.
   */
  readonly ready: Promise<void>;
}

/** Root of this module's errors. */
export declare class JugglerError extends Error {}

/** The server refused the message. */
export declare class NackError extends JugglerError {
  /** 500 for broker errors (not done); 504 when the outcome is unknown (a CALL may have been queued, a PUB
   * published); 401/403 … from middleware. */
  readonly code: number;
  readonly serverMessage: string;
  readonly forType: number;
  /** uuid of the refused message. */
  readonly for: string;
  readonly uri?: string;
  readonly channel?: string;
}

/** No RES (call) or ACK (publish, subscribe) within the timeout; a late answer is ignored. */
export declare class ExpiredError extends JugglerError {
  readonly timeout: number;
  readonly uuid: string;
}

/** The connection dropped after the message was sent: it may or may not have been executed. */
export declare class ConnectionLostError extends JugglerError {}

/** close() was called, reconnection gave up, or the first connection failed. */
export declare class ConnectionClosedError extends JugglerError {}

export interface StateChangeDetail {
  state: State;
  /** Reconnection attempt number (state "reconnecting"). */
  attempt?: number;
  /** Delay before that attempt, ms. */
  delay?: number;
}

/**
 * A juggler.0 connection that reconnects by itself (backoff with jitter) and
 * restores its subscriptions; on channels with history it recovers what was
 * published while it was away. Events: "statechange" (CustomEvent<StateChangeDetail>),
 * "open", "close", "error" (CustomEvent<{error: unknown}>), "publication"
 * (CustomEvent<JugglerEvent>: an event of a server-side subscription), "unrecovered"
 * (CustomEvent<{channel: string}>: events of that channel were lost; reload its state),
 * "subscriptionend" (CustomEvent<{channel: string, pattern: boolean}>: the server
 * ended a private subscription whose token was not renewed in time) and "fallback"
 * (CustomEvent<{transport: Transport, error: unknown}>: a transport failed, the next one is tried).
 */
export declare class Juggler extends EventTarget {
  /** Resolves once connected; rejects with ConnectionClosedError if the first attempt fails. */
  static connect(url: string | URL, options?: ConnectOptions): Promise<Juggler>;
  constructor(url: string | URL, options?: ConnectOptions);
  /** The URL dialled: the one given, with the query parameters of `keepalive` and `headersAsQuery`. */
  readonly url: string;
  readonly state: State;
  /** The transport in use (or being tried). */
  readonly transport: Transport;
  /**
   * Call `uri`. Resolves with the result — a callee error is a result too:
   * `{error: {message}}`. Rejects with NackError, ExpiredError,
   * ConnectionLostError or ConnectionClosedError. Made while reconnecting, the
   * call waits (its timer running) and is sent once connected.
   */
  call<T = Json>(uri: string, args?: Json, options?: CallOptions): Promise<T>;
  /** Publish; resolves on the server's ACK. */
  publish(channel: string, args?: Json, options?: CallOptions): Promise<void>;
  /** Subscribe a handler; returns its unsubscribe function (see Unsubscribe). */
  subscribe(channel: string, handler: EventHandler, options?: SubscribeOptions): Unsubscribe;
  /**
   * A channel's kept publications (HISTORY request). Rejects with NackError
   * where the server does not let clients read it (400: no history; 403: not
   * allowed on that channel, or for this connection).
   */
  history(channel: string, options?: HistoryOptions): Promise<HistoryResult>;
  /** Who is subscribed to `channel`, by client id (PRESENCE request); rejects as history(). */
  presence(channel: string, options?: { timeout?: number }): Promise<Record<string, ClientInfo>>;
  /**
   * The last event seen of each server-side subscription with history, by
   * channel: after a reconnection, `history(channel, {since})` from there
   * reads what was missed (nothing is recovered by itself for them).
   */
  readonly serverPositions: ReadonlyMap<string, { offset: number; epoch: string }>;
  /** Close for good (idempotent); everything pending rejects with ConnectionClosedError. */
  close(): void;
}

export default Juggler;
