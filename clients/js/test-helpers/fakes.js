// Test doubles: a clock whose timers run only when the test advances it, and a
// WebSocket class whose "server side" the test drives frame by frame.

export class FakeClock {
  constructor(start = 1_700_000_000_000) {
    this.time = start;
    this.timers = new Map();
    this.nextId = 1;
    this.setTimeout = (fn, ms) => {
      const id = this.nextId++;
      this.timers.set(id, { at: this.time + Math.max(0, ms), fn, id });
      return id;
    };
    this.clearTimeout = (id) => {
      this.timers.delete(id);
    };
    this.now = () => this.time;
  }

  /** Delays of the timers now waiting, soonest first. */
  pending() {
    return [...this.timers.values()].map((t) => t.at - this.time).sort((a, b) => a - b);
  }

  /** Move time forward by `ms`, running every timer that falls due, in order. */
  advance(ms) {
    const end = this.time + ms;
    for (;;) {
      let next = null;
      for (const t of this.timers.values()) {
        if (t.at <= end && (next === null || t.at < next.at || (t.at === next.at && t.id < next.id))) {
          next = t;
        }
      }
      if (next === null) break;
      this.timers.delete(next.id);
      this.time = next.at;
      next.fn();
    }
    this.time = end;
  }
}

/** Returns a fresh FakeSocket class with its own list of instances. */
export function fakeSocketClass() {
  class FakeSocket {
    static instances = [];
    static get last() {
      return FakeSocket.instances[FakeSocket.instances.length - 1];
    }

    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.bufferedAmount = 0;
      this.sent = [];
      this.closedWith = null;
      this.onmessage = null;
      this.onclose = null;
      this.onerror = null;
      FakeSocket.instances.push(this);
    }

    send(text) {
      if (this.readyState !== 1) throw new Error("send on a socket that is not open");
      this.sent.push(JSON.parse(text));
    }

    close(code, reason) {
      this.closedWith = { code, reason };
      this.readyState = 3;
    }

    // ---- the server's side ----
    /** The upgrade succeeds and the server greets the client. */
    accept(heartbeat_s = 25, connection_id = "1.1") {
      this.readyState = 1;
      this.frame({ type: "connected", connection_id, heartbeat_s });
    }

    frame(obj) {
      this.onmessage?.({ data: typeof obj === "string" ? obj : JSON.stringify(obj) });
    }

    serverClose(code, reason = "") {
      this.readyState = 3;
      this.onclose?.({ code, reason, wasClean: code !== 1006 });
    }

    /** Frames of a type the client sent. */
    sentOf(type) {
      return this.sent.filter((f) => f.type === type);
    }
  }
  return FakeSocket;
}

/** A JWT-shaped token (unsigned: the client never verifies) with these claims. */
export function fakeJwt(claims) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}.c2ln`;
}

/** Let pending promise callbacks (getToken) run. */
export async function flush() {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}
