// ringcast-client: the browser and Node client of ringcast's WebSocket API.
//
// One ES module, no runtime dependencies. Browsers use their own WebSocket; on Node 20
// (which has none) pass a constructor, e.g. `new Ringcast(url, {key, WebSocket})` with
// `import WebSocket from "ws"`.
//
// Model: a subscription is state, not a queued request. The client holds the set of
// channels the application wants; every time a connection is established it subscribes to
// each of them (with `since` where the channel has history), and nothing is queued while
// disconnected. Timers, the clock and randomness are options so the state machine can be
// driven by tests.

/** Close codes with a meaning for the client. */
export const CloseCodes = Object.freeze({
  KEY_REVOKED: 4001,
  SLOW_CONSUMER: 4008,
  HEARTBEAT_TIMEOUT: 4009,
  USER_DISCONNECTED: 4010,
  TOKEN_EXPIRED: 4011,
  GOING_AWAY: 1001,
  ABNORMAL: 1006,
  TRY_AGAIN_LATER: 1013,
});

const CLOSE_NAMES = {
  1000: "closed",
  1001: "server_shutdown",
  1002: "protocol_error",
  1003: "unsupported_data",
  1006: "connection_lost",
  1007: "invalid_payload",
  1009: "frame_too_large",
  1011: "server_error",
  1013: "try_again_later",
  4001: "key_revoked",
  4008: "slow_consumer",
  4009: "heartbeat_timeout",
  4010: "disconnected",
  4011: "token_expired",
};

/** Close code the client sends when it gives up on a connection it considers dead. */
const CLIENT_GIVE_UP = 4000;
/** WebSocket readyState OPEN. */
const OPEN = 1;
/** Channel errors that end a subscription attempt (not retried until the next connection). */
const SUBSCRIBE_ERRORS = new Set([
  "forbidden",
  "invalid_channel",
  "too_many_subscriptions",
  "presence_full",
]);

/**
 * Delay before reconnect attempt `attempt` (0 for the first after a loss): exponential
 * backoff with full jitter, uniform in [min, min(max, min * 2^(attempt+1))].
 */
export function backoffDelay(attempt, minMs, maxMs, random = Math.random) {
  const min = Math.max(0, minMs);
  const max = Math.max(min, maxMs);
  const cap = Math.min(max, min * 2 ** Math.min(attempt + 1, 30));
  return Math.round(min + random() * (cap - min));
}

/**
 * The least wait a close asks for (else `undefined`): 1013 `retry_after=<s>` (node over its upgrade
 * rate): s seconds plus up to 1 s of jitter; 1001 (shutdown): uniform over [min, spreadMs], so a
 * stopping node's clients do not reach the next node all at once.
 */
export function closeDelay(code, reason, minMs, spreadMs, random = Math.random) {
  const m = code === 1013 && /(?:^|[^a-z_])retry_after=(\d{1,4})(?:$|\D)/.exec(reason ?? "");
  if (m) return Math.round(Math.min(Math.max(Number(m[1]), 1), 60) * 1000 + random() * 1000);
  if (code !== 1001) return undefined;
  const min = Math.max(0, minMs);
  return Math.round(min + random() * Math.max(0, spreadMs - min));
}

/** A JWT's `exp` (seconds since the epoch), read without verifying it; else `undefined`. */
export function jwtExp(token) {
  if (typeof token !== "string") return undefined;
  const parts = token.split(".");
  if (parts.length !== 3) return undefined;
  try {
    let b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    while (b64.length % 4) b64 += "=";
    const bin = atob(b64);
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return typeof claims.exp === "number" ? claims.exp : undefined;
  } catch {
    return undefined;
  }
}

/** An Error with a machine-readable `code` (and `channel`, `closeCode`, `frame` when known). */
export class RingcastError extends Error {
  constructor(code, message, extra = {}) {
    super(message);
    this.name = "RingcastError";
    this.code = code;
    Object.assign(this, extra);
  }
}

function noop() {}

/** A presence member as the client lists it: `info` only when the user has one. */
function member(user_id, info) {
  return info === undefined ? { user_id } : { user_id, info };
}

function needsToken(channel) {
  return channel.startsWith("private-") || channel.startsWith("presence-");
}

/** A small event emitter. A listener that throws is reported as an `error` event. */
class Emitter {
  constructor() {
    this._listeners = new Map();
  }

  /** Add a listener; returns `this`. */
  on(event, fn) {
    if (typeof fn !== "function") throw new TypeError("listener must be a function");
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(fn);
    return this;
  }

  /** Remove a listener; returns `this`. */
  off(event, fn) {
    this._listeners.get(event)?.delete(fn);
    return this;
  }

  _emit(event, ...args) {
    const set = this._listeners.get(event);
    if (!set || set.size === 0) return false;
    for (const fn of [...set]) {
      try {
        fn(...args);
      } catch (e) {
        this._listenerThrew(event, e);
      }
    }
    return true;
  }

  _listenerThrew(event, e) {
    if (event === "error") {
      // An error handler failed: hand it to the host (window.onerror / uncaughtException).
      setTimeout(() => {
        throw e;
      }, 0);
    } else {
      this._emit("error", e);
    }
  }
}

/** One channel the application holds. Created by `Ringcast.subscribe`. */
export class Subscription extends Emitter {
  constructor(client, channel, handler) {
    super();
    this.client = client;
    this.channel = channel;
    this._handler = handler;
    /** "pending" (waiting for a connection), "subscribing", "subscribed" or "unsubscribed". */
    this.state = "pending";
    /** Last position seen on this channel (history), used for `since` on resubscribe. */
    this.offset = undefined;
    this.epoch = undefined;
    this._members = new Map();
    this._refreshTimer = null;
    this._tokenExp = undefined;
    this._attempt = 0;
  }

  /** Presence channels: the members, in join order, as `{user_id, info}`. */
  get members() {
    return [...this._members.values()];
  }

  /** Stop receiving this channel. */
  unsubscribe() {
    this.client._unsubscribe(this);
  }

  /**
   * Send a client event (`client-...`) to the other subscribers of this private or presence
   * channel. Returns false when it cannot be sent now (not subscribed, or the socket's send
   * buffer is full); nothing is queued.
   */
  trigger(event, data) {
    if (typeof event !== "string" || !event.startsWith("client-")) {
      throw new RingcastError("invalid_event", "client event names start with 'client-'");
    }
    if (this.state !== "subscribed") return false;
    return this.client._send({ type: "client_event", channel: this.channel, event, data });
  }

  _emit(event, ...args) {
    const delivered = super._emit(event, ...args);
    // An error nobody listens to on the subscription reaches the client's error event.
    if (!delivered && event === "error") this.client._emitError(args[0]);
    return delivered;
  }
}

/**
 * The client. See README.md beside this file for the options and events.
 */
export class Ringcast extends Emitter {
  constructor(url, options = {}) {
    super();
    if (!options.key) throw new TypeError("options.key (a public key pk_...) is required");
    this.url = url;
    this.options = options;
    this._socketUrl(); // throws now on a URL that can never work
    this.minReconnectDelayMs = options.minReconnectDelayMs ?? 500;
    this.maxReconnectDelayMs = Math.max(
      this.minReconnectDelayMs,
      options.maxReconnectDelayMs ?? 20000,
    );
    this.shutdownReconnectSpreadMs = options.shutdownReconnectSpreadMs ?? 3000;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 10000;
    this.heartbeatMarginMs = options.heartbeatMarginMs ?? 5000;
    this.tokenRefreshMarginMs = options.tokenRefreshMarginMs ?? 30000;
    this.maxBufferedBytes = options.maxBufferedBytes ?? 1 << 20;
    this._WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this._setTimeout = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this._clearTimeout = options.clearTimeout ?? ((t) => clearTimeout(t));
    this._now = options.now ?? (() => Date.now());
    this._random = options.random ?? Math.random;

    /** "connecting" | "connected" | "disconnected" | "closed". */
    this.state = "disconnected";
    /** Id and user of the current connection (from the server's `connected` frame). */
    this.connectionId = this.userId = undefined;
    // The connection token (options.token), refreshed as a subscription's token is.
    this._user = { channel: undefined, _refreshTimer: null, _emit: (_, e) => this._emitError(e) };
    this._userToken = null;
    this._ws = null;
    this._subs = new Map(); // channel -> Subscription
    this._pending = []; // channels whose subscribe was sent and not yet answered, in order
    this._attempt = 0; // consecutive reconnects without a stable connection
    this._reconnectTimer = null;
    this._connectTimer = null;
    this._heartbeatTimer = null;
    this._heartbeatMs = 0;
    this._lastFrameAt = 0;
    this._pingSentAt = 0;
    this._connectedAt = 0;
    this._socketError = undefined; // detail of the current socket's error event, if any
  }

  /** Open the connection (again). Does nothing while connecting or connected. */
  connect() {
    if (this.state === "connecting" || this.state === "connected") return;
    this._cancel("_reconnectTimer");
    this._attempt = 0;
    this._open();
  }

  /** Close the connection for good: state `closed`, no reconnect. Subscriptions are kept. */
  close() {
    this._cancel("_reconnectTimer");
    this._drop(1000, "client closed");
    this._setState("closed");
  }

  /**
   * Hold `channel`: subscribe now if connected, and again after every reconnect.
   * `handler(msg)` receives `{channel, event, data, id[, offset, epoch, user_id]}`.
   */
  subscribe(channel, handler) {
    if (typeof channel !== "string" || channel.length === 0) {
      throw new TypeError("channel must be a non-empty string");
    }
    if (this._subs.has(channel)) {
      throw new RingcastError(
        "already_subscribed",
        `already subscribed to "${channel}": unsubscribe first or keep the existing subscription`,
        { channel },
      );
    }
    const sub = new Subscription(this, channel, handler);
    this._subs.set(channel, sub);
    if (this.state === "connected") this._sendSubscribe(sub);
    return sub;
  }

  /** The subscription held for `channel`, if any. */
  subscription(channel) {
    return this._subs.get(channel);
  }

  // ---- connection ----------------------------------------------------------------

  _socketUrl() {
    const base = globalThis.location?.href;
    let u;
    try {
      u = base ? new URL(this.url, base) : new URL(this.url);
    } catch {
      throw new TypeError(`not a WebSocket URL: ${this.url}`);
    }
    if (u.protocol === "http:") u.protocol = "ws:";
    if (u.protocol === "https:") u.protocol = "wss:";
    if (u.protocol !== "ws:" && u.protocol !== "wss:") {
      throw new TypeError(`not a WebSocket URL (ws://, wss://, http:// or https://): ${this.url}`);
    }
    u.searchParams.set("key", this.options.key);
    if (this._userToken) u.searchParams.set("token", this._userToken);
    return u.toString();
  }

  _open() {
    this._setState("connecting");
    if (this.state !== "connecting") return; // a state listener closed the client
    if (this.options.token !== undefined && this._userToken === null) {
      // The connection token first (options.token); a state change meanwhile wins.
      const go = (token) => ((this._userToken = token), this.state === "connecting" && !this._ws && this._open());
      this._token(this._user).then(go, (err) => this.state === "connecting" && (this._emitError(err), this._lost()));
      return;
    }
    const Ctor = this._WebSocket;
    if (typeof Ctor !== "function") {
      const why = "no WebSocket implementation: pass options.WebSocket (e.g. from the 'ws' package on Node 20)";
      this._emitError(new RingcastError("no_websocket", why));
      this._setState("closed");
      return;
    }
    let ws;
    try {
      ws = new Ctor(this._socketUrl());
    } catch (e) {
      this._emitError(new RingcastError("connect_failed", String(e?.message ?? e), { cause: e }));
      this._lost();
      return;
    }
    this._ws = ws;
    ws.onmessage = (ev) => {
      if (ws === this._ws) this._onFrame(ev.data);
    };
    this._socketError = undefined;
    ws.onerror = (ev) => {
      // Browsers give no detail here (the close event that follows says what happened);
      // Node's `ws` does ("Unexpected server response: 401"): keep it for that close.
      if (ws === this._ws) this._socketError = ev?.message ?? ev?.error?.message;
    };
    ws.onclose = (ev) => {
      if (ws === this._ws) this._onClose(ev.code, ev.reason);
    };
    this._connectTimer = this._setTimeout(() => {
      this._connectTimer = null;
      if (ws !== this._ws || this.state !== "connecting") return;
      this._emitError(new RingcastError("connect_timeout", `no connected frame within ${this.connectTimeoutMs} ms`));
      this._drop(CLIENT_GIVE_UP, "connect timeout");
      this._lost();
    }, this.connectTimeoutMs);
  }

  /** Detach and close the current socket (its later events are ignored). */
  _drop(code, reason) {
    this._cancel("_connectTimer");
    this._cancel("_heartbeatTimer");
    this._cancelRefresh(this._user);
    for (const sub of this._subs.values()) this._resetSub(sub);
    this._pending = [];
    const ws = this._ws;
    this._ws = null;
    if (!ws) return;
    // No-op handlers rather than none: the 'ws' package throws an 'error' event that has
    // no listener (closing a socket that is still connecting emits one).
    ws.onmessage = ws.onerror = ws.onclose = noop;
    try {
      ws.close(code, reason);
    } catch {
      // already closed
    }
  }

  _onClose(code, reason) {
    const wasConnected = this.state === "connected";
    this._drop(1000);
    const name = CLOSE_NAMES[code] ?? "connection_closed";
    const detail = reason || this._socketError;
    const message = `connection closed (${code}${detail ? `: ${detail}` : ""})`;
    this._emitError(new RingcastError(name, message, { closeCode: code, reason }));
    // Ended for good: a revoked key, a disconnected user, an expired token given as a string.
    const fixed = code === CloseCodes.TOKEN_EXPIRED && typeof this.options.token === "string";
    if (code === CloseCodes.KEY_REVOKED || code === CloseCodes.USER_DISCONNECTED || fixed) {
      this._setState("closed");
      return;
    }
    // A new connection token for the next attempt: this one expired, or was refused.
    if (code === CloseCodes.TOKEN_EXPIRED || !wasConnected) this._userToken = null;
    if (wasConnected && this._now() - this._connectedAt >= this._stableMs()) this._attempt = 0;
    const { minReconnectDelayMs: min, shutdownReconnectSpreadMs: spread } = this;
    this._lost(closeDelay(code, reason, min, spread, this._random));
  }

  /** A connection that lasted this long resets the backoff. */
  _stableMs() { return Math.max(5000, this.maxReconnectDelayMs); }

  /** The connection is gone (not by the application): wait (at least `atLeast`), retry. */
  _lost(atLeast = 0) {
    this._setState("disconnected");
    if (this.state !== "disconnected") return; // a state listener closed the client
    const delay = Math.max(
      atLeast ?? 0,
      backoffDelay(this._attempt, this.minReconnectDelayMs, this.maxReconnectDelayMs, this._random),
    );
    this._attempt += 1;
    this._cancel("_reconnectTimer");
    this._reconnectTimer = this._setTimeout(() => {
      this._reconnectTimer = null;
      if (this.state === "disconnected") this._open();
    }, delay);
  }

  // ---- heartbeat -----------------------------------------------------------------

  _deadAfterMs() {
    return 3 * this._heartbeatMs + this.heartbeatMarginMs;
  }

  /**
   * One timer per connection (re-armed when it fires, not per frame): while the server is
   * silent the client sends a ping every `heartbeat_s`; silent for 3 x `heartbeat_s` +
   * margin, the connection is dead.
   */
  _armHeartbeat() {
    this._cancel("_heartbeatTimer");
    if (!this._heartbeatMs) return;
    const now = this._now();
    const idle = now - this._lastFrameAt;
    const deadIn = this._deadAfterMs() - idle;
    if (deadIn <= 0) {
      this._emitError(new RingcastError("heartbeat_timeout", `no frame from the server for ${idle} ms: reconnecting`));
      this._drop(CLIENT_GIVE_UP, "heartbeat timeout");
      this._lost();
      return;
    }
    // Ping when neither a frame came nor a ping went for heartbeat_s.
    let quietFor = now - Math.max(this._lastFrameAt, this._pingSentAt);
    if (quietFor >= this._heartbeatMs) {
      this._send({ type: "ping" });
      this._pingSentAt = now;
      quietFor = 0;
    }
    const next = Math.min(deadIn, this._heartbeatMs - quietFor);
    this._heartbeatTimer = this._setTimeout(() => {
      this._heartbeatTimer = null;
      this._armHeartbeat();
    }, next);
  }

  // ---- frames --------------------------------------------------------------------

  _send(frame) {
    const ws = this._ws;
    if (!ws || ws.readyState !== OPEN) return false;
    if ((ws.bufferedAmount ?? 0) > this.maxBufferedBytes) {
      this._emitError(new RingcastError("send_buffer_full", "the socket's send buffer is full; frame not sent"));
      return false;
    }
    ws.send(JSON.stringify(frame));
    return true;
  }

  _onFrame(data) {
    this._lastFrameAt = this._now();
    if (typeof data !== "string") {
      this._emitError(new RingcastError("invalid_frame", "binary frame from the server"));
      return;
    }
    let f;
    try {
      f = JSON.parse(data);
    } catch {
      this._emitError(new RingcastError("invalid_frame", "a frame from the server is not JSON"));
      return;
    }
    if (f === null || typeof f !== "object") return;
    const sub = typeof f.channel === "string" ? this._subs.get(f.channel) : undefined;
    switch (f.type) {
      case "message":
        if (sub && sub.state === "subscribed") this._deliver(sub, f);
        break;
      case "connected":
        this._onConnected(f);
        break;
      case "pong":
        break;
      case "subscribed":
        this._settle(f.channel);
        if (sub && sub.state === "subscribing") this._onSubscribed(sub, f);
        break;
      case "unsubscribed":
        this._settle(f.channel);
        // Without a reason this is the answer to our own unsubscribe.
        if (sub && f.reason) {
          this._removeSub(sub);
          sub.state = "unsubscribed";
          sub._emit("unsubscribed", f.reason);
        }
        break;
      case "refreshed":
        this._settle(f.channel); // a connection token's refresh waits as `undefined`
        if (typeof f.exp !== "number") break;
        if (sub) this._scheduleRefresh(sub, f.exp);
        else if (f.channel === undefined) this._scheduleRefresh(this._user, f.exp);
        break;
      case "presence":
        if (sub && sub.state === "subscribed") this._onPresence(sub, f);
        break;
      case "error":
        this._onErrorFrame(f);
        break;
      default:
        // Unknown frame types are ignored: the server may add some.
        break;
    }
  }

  _onConnected(f) {
    this._cancel("_connectTimer");
    this.connectionId = f.connection_id;
    this.userId = f.user_id;
    this._heartbeatMs = Math.max(1, Number(f.heartbeat_s) || 25) * 1000;
    this._connectedAt = this._now();
    this._pingSentAt = 0;
    this._setState("connected");
    if (this.state !== "connected") return; // a state listener closed us
    for (const sub of [...this._subs.values()]) {
      if (sub.state === "pending") this._sendSubscribe(sub);
    }
    this._armHeartbeat();
    if (this._userToken) this._scheduleRefresh(this._user, jwtExp(this._userToken));
  }

  _deliver(sub, f) {
    if (typeof f.offset === "number") {
      sub.offset = f.offset;
      if (typeof f.epoch === "string") sub.epoch = f.epoch;
    }
    const msg = { channel: f.channel, event: f.event, data: f.data, id: f.id };
    if (f.offset !== undefined) msg.offset = f.offset;
    if (f.epoch !== undefined) msg.epoch = f.epoch;
    if (f.user_id !== undefined) msg.user_id = f.user_id;
    if (typeof sub._handler !== "function") return;
    try {
      sub._handler(msg);
    } catch (e) {
      sub._emit("error", e);
    }
  }

  _onSubscribed(sub, f) {
    sub.state = "subscribed";
    sub._attempt = 0;
    // With `recovered: true` the missed messages follow this frame: the position stays
    // at the last message actually seen until they arrive (a connection lost mid-replay
    // must ask again from there, not from the end of the replay).
    if (f.recovered !== true) {
      if (typeof f.offset === "number") sub.offset = f.offset;
      if (typeof f.epoch === "string") sub.epoch = f.epoch;
    }
    // The member list is the server's, whole: nothing from an earlier connection is
    // kept (members who left while we were away must not linger).
    sub._members = new Map();
    if (f.presence && Array.isArray(f.presence.members)) {
      for (const m of f.presence.members) {
        if (m === null || typeof m !== "object" || m.user_id === undefined) continue;
        const user_id = String(m.user_id);
        if (!sub._members.has(user_id)) sub._members.set(user_id, member(user_id, m.info));
      }
    }
    const info = { ...f };
    delete info.type;
    sub._emit("subscribed", info);
  }

  /**
   * A join or leave. The server sends one join per user (its first connection) and one leave (its
   * last): a join for a member already listed or a leave for one not listed changes nothing and is
   * not reported. A leave reports the info the member joined with.
   */
  _onPresence(sub, f) {
    if (f.user_id === undefined) return;
    const user_id = String(f.user_id);
    let ev;
    if (f.action === "join") {
      if (sub._members.has(user_id)) return;
      const m = member(user_id, f.info);
      sub._members.set(user_id, m);
      ev = { action: "join", ...m };
    } else if (f.action === "leave") {
      const m = sub._members.get(user_id);
      if (!m) return;
      sub._members.delete(user_id);
      ev = { action: "leave", ...m };
    } else {
      return;
    }
    sub._emit("presence", ev);
  }

  _onErrorFrame(f) {
    const code = typeof f.code === "string" ? f.code : "error";
    let sub = typeof f.channel === "string" ? this._subs.get(f.channel) : undefined;
    // Errors without a channel field (the server's channel checks) answer the oldest frame
    // still waiting: a subscribe, or (`undefined`) a connection token's refresh.
    if (!sub && f.channel === undefined && SUBSCRIBE_ERRORS.has(code) && this._pending.length) {
      sub = this._subs.get(this._pending[0]);
      if (this._pending[0] === undefined) this._settle(undefined);
    }
    const err = new RingcastError(code, f.message ?? code, { frame: f });
    if (!sub) {
      this._emitError(err);
      return;
    }
    err.channel = sub.channel;
    if (sub.state === "subscribing" && code === "rate_limited") {
      // Over the connection's subscribe budget (subscribe_rate_per_connection): nothing
      // was refused for good, so the subscribe is sent again on this connection after
      // 1 to 2 s (the budget refills at 20 per second by default).
      this._settle(sub.channel);
      const ws = this._ws;
      this._setTimeout(() => {
        if (ws !== this._ws || this._subs.get(sub.channel) !== sub) return;
        if (sub.state === "subscribing") this._sendSubscribe(sub);
      }, 1000 + Math.round(this._random() * 1000));
    } else if (sub.state === "subscribing" && SUBSCRIBE_ERRORS.has(code)) {
      // The subscribe was refused: the channel is no longer held, and is not retried in a
      // loop. The application may subscribe again (e.g. after fixing its token endpoint).
      this._settle(sub.channel);
      this._removeSub(sub);
      sub.state = "unsubscribed";
    }
    sub._emit("error", err);
  }

  _settle(channel) {
    const i = this._pending.indexOf(channel);
    if (i >= 0) this._pending.splice(i, 1);
  }

  // ---- subscriptions -------------------------------------------------------------

  _sendSubscribe(sub) {
    sub.state = "subscribing";
    const frame = { type: "subscribe", channel: sub.channel };
    if (typeof sub.offset === "number" && typeof sub.epoch === "string") {
      frame.since = { offset: sub.offset, epoch: sub.epoch };
    }
    if (!needsToken(sub.channel)) {
      this._pending.push(sub.channel);
      this._send(frame);
      return;
    }
    const ws = this._ws;
    this._token(sub).then(
      (token) => {
        // The connection or the subscription may have changed while we waited.
        if (ws !== this._ws || this._subs.get(sub.channel) !== sub) return;
        if (sub.state !== "subscribing") return;
        frame.token = token;
        this._pending.push(sub.channel);
        this._send(frame);
        this._scheduleRefresh(sub, jwtExp(token));
      },
      (err) => {
        if (ws !== this._ws || this._subs.get(sub.channel) !== sub) return;
        // No token: the subscription waits for the next connection (or a new subscribe).
        sub.state = "pending";
        sub._emit("error", err);
      },
    );
  }

  /** A token from the application: the channel's (getToken), or the connection's (token). */
  async _token(sub) {
    const user = sub === this._user;
    const getToken = user ? this.options.token : this.options.getToken;
    if (user && typeof getToken === "string") return getToken;
    const needs = user ? "options.token (a string or a function)" : "options.getToken(channel)";
    if (typeof getToken !== "function") {
      const why = `${user ? "the connection" : `"${sub.channel}"`} needs a token: pass ${needs}`;
      throw new RingcastError("token_required", why, { channel: sub.channel });
    }
    const what = this._tokenSource(sub);
    let token;
    try {
      token = await getToken(sub.channel);
    } catch (e) {
      throw new RingcastError("token_failed", `${what} failed: ${e?.message ?? e}`, { channel: sub.channel, cause: e });
    }
    if (typeof token !== "string" || token === "") {
      throw new RingcastError("token_failed", `${what} returned no token`, { channel: sub.channel });
    }
    return token;
  }

  _tokenSource(sub) {
    return sub === this._user ? "options.token()" : `getToken("${sub.channel}")`;
  }

  /** Whether `sub` (or the connection token's pseudo-subscription) is still held. */
  _holds(sub) {
    return sub === this._user || this._subs.get(sub.channel) === sub;
  }

  /** Ask for a fresh token before `exp` (seconds); refresh at most once per token. */
  _scheduleRefresh(sub, exp) {
    this._cancelRefresh(sub);
    if (typeof exp !== "number") return;
    // A connection token given as a string cannot be renewed: the server ends it (4011).
    if (sub === this._user && typeof this.options.token !== "function") return;
    sub._tokenExp = exp;
    const remaining = exp * 1000 - this._now();
    const delay = Math.max(1000, remaining - Math.min(this.tokenRefreshMarginMs, remaining / 2));
    const ws = this._ws;
    sub._refreshTimer = this._setTimeout(() => {
      sub._refreshTimer = null;
      if (ws !== this._ws || !this._holds(sub)) return;
      this._token(sub).then(
        (token) => {
          if (ws !== this._ws || !this._holds(sub)) return;
          const newExp = jwtExp(token);
          if (typeof newExp === "number" && newExp <= exp) {
            const why = `${this._tokenSource(sub)} returned a token that does not expire later than the current one`;
            sub._emit("error", new RingcastError("token_not_refreshed", why, { channel: sub.channel }));
            return;
          }
          if (sub === this._user) this._userToken = token; // for the next reconnect too
          if (sub === this._user) this._pending.push(undefined); // answered in order, see _settle
          this._send({ type: "refresh", channel: sub.channel, token });
          // The server's `refreshed` answer reschedules with the exp it accepted.
          this._scheduleRefresh(sub, newExp);
        },
        (err) => {
          if (ws === this._ws && this._holds(sub)) sub._emit("error", err);
        },
      );
    }, delay);
  }

  _cancelRefresh(sub) {
    if (sub._refreshTimer !== null) this._clearTimeout(sub._refreshTimer);
    sub._refreshTimer = null;
  }

  /** Back to "pending" after a connection loss (keeps offset/epoch for `since`). */
  _resetSub(sub) {
    this._cancelRefresh(sub);
    if (sub.state !== "unsubscribed") sub.state = "pending";
    sub._members = new Map();
  }

  /** The channel is no longer held: no refresh, no members. */
  _removeSub(sub) {
    this._cancelRefresh(sub);
    sub._members = new Map();
    if (this._subs.get(sub.channel) === sub) this._subs.delete(sub.channel);
  }

  _unsubscribe(sub) {
    if (this._subs.get(sub.channel) !== sub) return;
    const wasActive = sub.state === "subscribing" || sub.state === "subscribed";
    this._removeSub(sub);
    sub.state = "unsubscribed";
    if (wasActive) this._send({ type: "unsubscribe", channel: sub.channel });
  }

  // ---- helpers -------------------------------------------------------------------

  _setState(state) {
    if (this.state === state) return;
    this.state = state;
    this._emit("state", state);
  }

  _emitError(err) {
    if (!this._emit("error", err)) {
      // Nobody listens: say it on the console rather than lose it.
      globalThis.console?.warn?.(`ringcast: ${err?.message ?? err}`);
    }
  }

  _cancel(name) {
    if (this[name] !== null) this._clearTimeout(this[name]);
    this[name] = null;
  }
}

export default Ringcast;
