// Type declarations for ringcast.js (ringcast-client).

export type ConnectionState = "connecting" | "connected" | "disconnected" | "closed";
export type SubscriptionState = "pending" | "subscribing" | "subscribed" | "unsubscribed";

/** A message frame as delivered to a subscription's handler. */
export interface Message<T = unknown> {
  channel: string;
  event: string;
  /** Exactly the published data: an object or a string. */
  data: T;
  id: string;
  /** Position in the channel's history (projects with history on). */
  offset?: number;
  epoch?: string;
  /** The sender of a client event on a presence channel. */
  user_id?: string;
}

/** A presence member: the token's `sub` (always a string) and its `info`, when it had one. */
export interface PresenceMember {
  user_id: string;
  /** The `info` of the user's first connection to the channel; absent when it had none. */
  info?: unknown;
}

/**
 * A user's first connection joined, or last connection left. One per user, whatever
 * the number of tabs; the subscriber's own join is in `members`, not an event.
 */
export interface PresenceEvent {
  action: "join" | "leave";
  user_id: string;
  /** The member's info; on a leave, the info it joined with. */
  info?: unknown;
}

/** The server's `subscribed` frame without its `type`. */
export interface SubscribedInfo {
  channel: string;
  recovered?: boolean;
  offset?: number;
  epoch?: string;
  presence?: { count: number; members: PresenceMember[] };
  [field: string]: unknown;
}

/** Errors carry a machine-readable code: a server error code ("forbidden", ...),
 * a close name ("key_revoked", "connection_lost", "heartbeat_timeout", ...) or a client
 * code ("token_required", "token_failed", "connect_timeout", ...). */
export class RingcastError extends Error {
  code: string;
  channel?: string;
  /** For connection errors: the WebSocket close code. */
  closeCode?: number;
  reason?: string;
  /** For server error frames: the frame itself. */
  frame?: Record<string, unknown>;
}

/** The minimum a WebSocket implementation must offer (browsers' WebSocket, the `ws` package). */
export interface WebSocketLike {
  readonly readyState: number;
  readonly bufferedAmount?: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

export interface RingcastOptions {
  /** A public key of the project (`pk_...`). Never a secret key. */
  key: string;
  /** For `private-` and `presence-` channels: a JWT from your backend. Called again before the token expires. */
  getToken?: (channel: string) => Promise<string> | string;
  /** The connection token (its `sub` is the connection's user): a JWT, or a function returning one; a function is called before each connect after a 4011 or a failed attempt, and before the token expires (refresh). */
  token?: string | (() => Promise<string> | string);
  /** Backoff floor (default 500 ms). */
  minReconnectDelayMs?: number;
  /** Backoff ceiling (default 20000 ms). */
  maxReconnectDelayMs?: number;
  /** After a 1001 (server shutdown) the first reconnect waits uniformly between the backoff floor and this (default 3000 ms). */
  shutdownReconnectSpreadMs?: number;
  /** Time allowed from opening a socket to the server's `connected` frame (default 10000 ms). */
  connectTimeoutMs?: number;
  /** Added to 3 x heartbeat_s before a silent connection counts as dead (default 5000 ms). */
  heartbeatMarginMs?: number;
  /** Refresh a token this long before it expires, or at half its remaining life if shorter (default 30000 ms). */
  tokenRefreshMarginMs?: number;
  /** `trigger` refuses to send while the socket has more than this many bytes unsent (default 1 MiB). */
  maxBufferedBytes?: number;
  /** A WebSocket constructor; default `globalThis.WebSocket` (Node 20 has none: pass `ws`). */
  WebSocket?: new (url: string) => WebSocketLike;
  /** Injectable timers, clock and randomness (tests). */
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: any) => void;
  now?: () => number;
  random?: () => number;
}

declare class Emitter<Events> {
  on<E extends keyof Events>(event: E, listener: Events[E]): this;
  off<E extends keyof Events>(event: E, listener: Events[E]): this;
}

export interface SubscriptionEvents {
  subscribed: (info: SubscribedInfo) => void;
  error: (err: RingcastError | Error) => void;
  /** A server-side end, e.g. "token_expired". */
  unsubscribed: (reason: string) => void;
  presence: (ev: PresenceEvent) => void;
}

export class Subscription<T = unknown> extends Emitter<SubscriptionEvents> {
  readonly client: Ringcast;
  readonly channel: string;
  readonly state: SubscriptionState;
  /** Last history position seen (sent as `since` on resubscribe). */
  readonly offset?: number;
  readonly epoch?: string;
  /**
   * Presence channels: the members in join order, the subscriber's own user included.
   * The server's list from the last `subscribed`, kept up to date by `presence` events;
   * empty while not subscribed (cleared when the connection is lost and replaced whole at
   * the next `subscribed`: re-read it there).
   */
  readonly members: PresenceMember[];
  unsubscribe(): void;
  /** Send a `client-...` event; false when it cannot be sent now (nothing is queued). */
  trigger(event: `client-${string}`, data: unknown): boolean;
}

export interface ClientEvents {
  state: (state: ConnectionState) => void;
  error: (err: RingcastError | Error) => void;
}

export class Ringcast extends Emitter<ClientEvents> {
  constructor(url: string, options: RingcastOptions);
  readonly url: string;
  readonly state: ConnectionState;
  readonly connectionId?: string;
  /** The connection's user (`user_id` of the `connected` frame), with a connection token. */
  readonly userId?: string;
  connect(): void;
  /** State "closed"; no reconnect until connect() is called again. Subscriptions are kept. */
  close(): void;
  /** Throws if the channel is already held. */
  subscribe<T = unknown>(channel: string, handler: (msg: Message<T>) => void): Subscription<T>;
  subscription(channel: string): Subscription | undefined;
}

export const CloseCodes: Readonly<{
  KEY_REVOKED: 4001;
  SLOW_CONSUMER: 4008;
  HEARTBEAT_TIMEOUT: 4009;
  USER_DISCONNECTED: 4010;
  TOKEN_EXPIRED: 4011;
  GOING_AWAY: 1001;
  ABNORMAL: 1006;
  TRY_AGAIN_LATER: 1013;
}>;

/**
 * The wait a close asks for, or undefined for the usual backoff: 1013 with
 * `retry_after=<s>` gives s seconds plus up to 1 s of jitter; 1001 gives uniform [min, spreadMs].
 */
export function closeDelay(
  code: number,
  reason: string | undefined,
  minMs: number,
  spreadMs: number,
  random?: () => number,
): number | undefined;

/** Reconnect delay for attempt n (0-based): uniform in [min, min(max, min * 2^(n+1))]. */
export function backoffDelay(attempt: number, minMs: number, maxMs: number, random?: () => number): number;

/** The `exp` claim of a JWT, decoded without verification. */
export function jwtExp(token: string): number | undefined;

export default Ringcast;
