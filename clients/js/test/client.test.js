import { test } from "node:test";
import assert from "node:assert/strict";
import { Ringcast } from "../ringcast.js";
import { fakeJwt, flush } from "../test-helpers/fakes.js";
import { setup } from "../test-helpers/setup.js";

test("connect: the key goes in the query, state follows the connected frame", () => {
  const { Socket, client, states } = setup();
  assert.equal(client.state, "disconnected");
  client.connect();
  assert.equal(Socket.instances.length, 1);
  const url = new URL(Socket.last.url);
  assert.equal(url.pathname, "/api/v1/ws");
  assert.equal(url.searchParams.get("key"), "pk_test");
  assert.deepEqual(states, ["connecting"]);
  Socket.last.accept(25, "7.42");
  assert.deepEqual(states, ["connecting", "connected"]);
  assert.equal(client.connectionId, "7.42");
  client.connect(); // no second socket while connected
  assert.equal(Socket.instances.length, 1);
});

test("http(s) URLs become ws(s) URLs", () => {
  const { Socket, client } = setup();
  client.url = "https://example.test/api/v1/ws?x=1";
  client.connect();
  const url = new URL(Socket.last.url);
  assert.equal(url.protocol, "wss:");
  assert.equal(url.searchParams.get("x"), "1");
  assert.equal(url.searchParams.get("key"), "pk_test");
});

test("a URL that can never work is refused at construction", () => {
  assert.throws(() => new Ringcast("not a url", { key: "pk_x" }), TypeError);
  assert.throws(() => new Ringcast("ftp://h/api/v1/ws", { key: "pk_x" }), TypeError);
  assert.throws(() => new Ringcast("ws://h/api/v1/ws", {}), TypeError);
});

test("subscribe before connecting sends nothing until connected, then once", () => {
  const { Socket, client } = setup();
  const got = [];
  const sub = client.subscribe("news", (m) => got.push(m));
  assert.equal(sub.state, "pending");
  client.connect();
  assert.deepEqual(Socket.last.sent, []);
  Socket.last.accept();
  assert.deepEqual(Socket.last.sent, [{ type: "subscribe", channel: "news" }]);
  assert.equal(sub.state, "subscribing");
  // A message before the subscribed answer is not delivered.
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 0, id: "0" });
  const infos = [];
  sub.on("subscribed", (i) => infos.push(i));
  Socket.last.frame({ type: "subscribed", channel: "news" });
  assert.deepEqual(infos, [{ channel: "news" }]);
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: { x: 1 }, id: "1" });
  Socket.last.frame({ type: "message", channel: "other", event: "e", data: {}, id: "2" });
  assert.deepEqual(got, [{ channel: "news", event: "e", data: { x: 1 }, id: "1" }]);
});

test("subscribing twice to one channel is refused; after unsubscribe it is allowed", () => {
  const { client } = setup();
  const sub = client.subscribe("news", () => {});
  assert.throws(() => client.subscribe("news", () => {}), { code: "already_subscribed" });
  sub.unsubscribe();
  client.subscribe("news", () => {});
});

test("unsubscribe sends the frame and stops delivery at once", () => {
  const { Socket, client } = setup();
  const got = [];
  client.connect();
  Socket.last.accept();
  const sub = client.subscribe("news", (m) => got.push(m.id));
  Socket.last.frame({ type: "subscribed", channel: "news" });
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 1, id: "a" });
  sub.unsubscribe();
  assert.deepEqual(Socket.last.sent.at(-1), { type: "unsubscribe", channel: "news" });
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 1, id: "b" });
  Socket.last.frame({ type: "unsubscribed", channel: "news" });
  assert.deepEqual(got, ["a"]);
  assert.equal(sub.state, "unsubscribed");
});

test("close 1006 reconnects after a jittered backoff and resubscribes every channel", () => {
  const { clock, Socket, client, states, errors } = setup();
  client.subscribe("a", () => {});
  client.subscribe("b", () => {});
  client.connect();
  Socket.last.accept();
  Socket.last.frame({ type: "subscribed", channel: "a" });
  Socket.last.frame({ type: "subscribed", channel: "b" });
  Socket.last.serverClose(1006);
  assert.equal(client.state, "disconnected");
  assert.equal(errors.at(-1).code, "connection_lost");
  assert.equal(errors.at(-1).closeCode, 1006);
  assert.equal(client.subscription("a").state, "pending");
  // attempt 0 with random 0.5: 100 + 0.5 * (200 - 100) = 150 ms
  assert.deepEqual(clock.pending(), [150]);
  clock.advance(149);
  assert.equal(Socket.instances.length, 1);
  clock.advance(1);
  assert.equal(Socket.instances.length, 2);
  assert.equal(client.state, "connecting");
  Socket.last.accept();
  assert.deepEqual(Socket.last.sent, [
    { type: "subscribe", channel: "a" },
    { type: "subscribe", channel: "b" },
  ]);
  assert.deepEqual(states, ["connecting", "connected", "disconnected", "connecting", "connected"]);
});

test("failed attempts back off exponentially up to the maximum", () => {
  const { clock, Socket, client } = setup({ random: () => 1 });
  client.connect();
  const delays = [];
  for (let i = 0; i < 6; i++) {
    Socket.last.serverClose(1006); // the upgrade failed
    delays.push(clock.pending()[0]);
    clock.advance(delays.at(-1));
  }
  assert.deepEqual(delays, [200, 400, 800, 1000, 1000, 1000]);
  assert.equal(Socket.instances.length, 7);
});

test("a connection that stayed up resets the backoff; a short one does not", () => {
  const { clock, Socket, client } = setup({ random: () => 1 });
  client.connect();
  Socket.last.serverClose(1006);
  clock.advance(200);
  Socket.last.serverClose(1006);
  clock.advance(400);
  Socket.last.accept();
  Socket.last.serverClose(1006); // up for 0 ms: keeps growing
  assert.deepEqual(clock.pending(), [800]);
  clock.advance(800);
  Socket.last.accept();
  clock.advance(60_000);
  Socket.last.serverClose(1006); // up for a minute: back to the first delay
  assert.deepEqual(clock.pending(), [200]);
});

test("close 4001 (key revoked) ends in closed with no reconnect", () => {
  const { clock, Socket, client, states, errors } = setup();
  client.subscribe("news", () => {});
  client.connect();
  Socket.last.accept();
  Socket.last.serverClose(4001, "key revoked");
  assert.equal(client.state, "closed");
  assert.equal(errors.at(-1).code, "key_revoked");
  assert.deepEqual(states, ["connecting", "connected", "closed"]);
  assert.deepEqual(clock.pending(), []);
  clock.advance(3_600_000);
  assert.equal(Socket.instances.length, 1);
  // The application may connect again on purpose.
  client.connect();
  assert.equal(Socket.instances.length, 2);
});

for (const code of [4008, 1001, 1011, 4009, 1000]) {
  test(`close ${code} leads to a reconnect`, () => {
    const { clock, Socket, client } = setup();
    client.connect();
    Socket.last.accept();
    Socket.last.serverClose(code);
    assert.equal(client.state, "disconnected");
    clock.advance(3000);
    assert.equal(Socket.instances.length, 2);
  });
}

test("close() by the application: state closed, socket closed, nothing scheduled", () => {
  const { clock, Socket, client, states } = setup();
  client.connect();
  Socket.last.accept();
  const ws = Socket.last;
  client.close();
  assert.equal(ws.closedWith.code, 1000);
  assert.equal(client.state, "closed");
  ws.serverClose(1000); // late close event of the old socket: ignored
  assert.deepEqual(states, ["connecting", "connected", "closed"]);
  assert.deepEqual(clock.pending(), []);
  clock.advance(100_000);
  assert.equal(Socket.instances.length, 1);
});

test("close() from a state listener stops everything at once", () => {
  const { clock, Socket, client } = setup();
  client.on("state", (s) => {
    if (s === "disconnected") client.close();
  });
  client.connect();
  Socket.last.accept();
  Socket.last.serverClose(1006);
  assert.equal(client.state, "closed");
  assert.deepEqual(clock.pending(), []);
});

test("close() while waiting to reconnect cancels the reconnect", () => {
  const { clock, Socket, client } = setup();
  client.connect();
  Socket.last.serverClose(1006);
  client.close();
  clock.advance(100_000);
  assert.equal(Socket.instances.length, 1);
  assert.equal(client.state, "closed");
});

test("resubscribe carries since from the last offset and epoch seen", () => {
  const { clock, Socket, client } = setup();
  const got = [];
  const a = client.subscribe("hist", (m) => got.push(m));
  client.subscribe("plain", () => {});
  client.connect();
  Socket.last.accept();
  Socket.last.frame({ type: "subscribed", channel: "hist", offset: 40, epoch: "ep1" });
  Socket.last.frame({ type: "subscribed", channel: "plain" });
  Socket.last.frame({
    type: "message", channel: "hist", event: "e", data: 1, id: "x", offset: 41, epoch: "ep1",
  });
  assert.deepEqual(got[0], { channel: "hist", event: "e", data: 1, id: "x", offset: 41, epoch: "ep1" });
  assert.equal(a.offset, 41);
  Socket.last.serverClose(1006);
  clock.advance(1000);
  Socket.last.accept();
  assert.deepEqual(Socket.last.sent, [
    { type: "subscribe", channel: "hist", since: { offset: 41, epoch: "ep1" } },
    { type: "subscribe", channel: "plain" },
  ]);
  const infos = [];
  a.on("subscribed", (i) => infos.push(i));
  Socket.last.frame({ type: "subscribed", channel: "hist", recovered: true, offset: 43, epoch: "ep1" });
  assert.deepEqual(infos, [{ channel: "hist", recovered: true, offset: 43, epoch: "ep1" }]);
  // Recovered messages arrive as ordinary frames after the answer.
  Socket.last.frame({ type: "message", channel: "hist", event: "e", data: 2, id: "y", offset: 42, epoch: "ep1" });
  Socket.last.frame({ type: "message", channel: "hist", event: "e", data: 3, id: "z", offset: 43, epoch: "ep1" });
  assert.deepEqual(got.map((m) => m.offset), [41, 42, 43]);
  // Not recovered: the new position replaces the old one.
  Socket.last.serverClose(1006);
  clock.advance(1000);
  Socket.last.accept();
  assert.deepEqual(Socket.last.sent[0].since, { offset: 43, epoch: "ep1" });
  Socket.last.frame({ type: "subscribed", channel: "hist", recovered: false, offset: 7, epoch: "ep2" });
  assert.equal(a.offset, 7);
  assert.equal(a.epoch, "ep2");
});

test("a connection lost mid-replay asks again from the last message actually seen", () => {
  const { clock, Socket, client } = setup();
  const got = [];
  const a = client.subscribe("hist", (m) => got.push(m));
  client.connect();
  Socket.last.accept();
  Socket.last.frame({ type: "subscribed", channel: "hist", offset: 5, epoch: "ep" });
  Socket.last.serverClose(1006);
  clock.advance(1000);
  Socket.last.accept();
  // Recovered 6..9, but only 6 arrives before the connection drops again.
  Socket.last.frame({ type: "subscribed", channel: "hist", recovered: true, offset: 9, epoch: "ep" });
  assert.equal(a.offset, 5, "not advanced to the end of a replay not yet received");
  Socket.last.frame({ type: "message", channel: "hist", event: "e", data: 6, id: "6", offset: 6, epoch: "ep" });
  Socket.last.serverClose(1006);
  clock.advance(1000);
  Socket.last.accept();
  assert.deepEqual(Socket.last.sent[0].since, { offset: 6, epoch: "ep" });
  assert.deepEqual(got.map((m) => m.offset), [6]);
});

test("heartbeat: ping after heartbeat_s of silence, dead after 3 x heartbeat_s + margin", () => {
  const { clock, Socket, client, errors } = setup({ heartbeatMarginMs: 2000 });
  client.connect();
  const ws = Socket.last;
  ws.accept(10);
  clock.advance(9_999);
  assert.deepEqual(ws.sentOf("ping"), []);
  clock.advance(1);
  assert.equal(ws.sentOf("ping").length, 1);
  // Silence continues: a ping every heartbeat_s, then dead 32 s after the last frame.
  clock.advance(10_000);
  assert.equal(ws.sentOf("ping").length, 2);
  clock.advance(11_999);
  assert.equal(ws.sentOf("ping").length, 3);
  assert.equal(client.state, "connected");
  clock.advance(1);
  assert.equal(client.state, "disconnected");
  assert.equal(errors.at(-1).code, "heartbeat_timeout");
  assert.equal(ws.closedWith.code, 4000);
  // And it reconnects.
  clock.advance(1000);
  assert.equal(Socket.instances.length, 2);
});

test("heartbeat: any frame from the server keeps the connection alive", () => {
  const { clock, Socket, client } = setup({ heartbeatMarginMs: 2000 });
  client.connect();
  const ws = Socket.last;
  ws.accept(10);
  for (let i = 0; i < 20; i++) {
    clock.advance(10_000); // silent for heartbeat_s: the client pings
    ws.frame({ type: "pong" });
  }
  assert.equal(client.state, "connected");
  assert.equal(ws.sentOf("ping").length, 20);
  // Busy channels: frames every second, no ping needed.
  const before = ws.sentOf("ping").length;
  for (let i = 0; i < 100; i++) {
    clock.advance(1000);
    ws.frame({ type: "message", channel: "x", event: "e", data: 1, id: String(i) });
  }
  assert.equal(ws.sentOf("ping").length, before);
  assert.equal(client.state, "connected");
});

test("no connected frame within connectTimeoutMs: give up and retry", () => {
  const { clock, Socket, client, errors } = setup({ connectTimeoutMs: 3000 });
  client.connect();
  clock.advance(2999);
  assert.equal(client.state, "connecting");
  clock.advance(1);
  assert.equal(client.state, "disconnected");
  assert.equal(errors.at(-1).code, "connect_timeout");
  clock.advance(1000);
  assert.equal(Socket.instances.length, 2);
});

test("private channels: the token from getToken goes in the subscribe frame", async () => {
  const asked = [];
  const { clock, Socket, client } = setup({
    getToken: async (channel) => {
      asked.push(channel);
      return fakeJwt({ channel, exp: Math.floor(clock.now() / 1000) + 600 });
    },
  });
  const sub = client.subscribe("private-orders", () => {});
  client.connect();
  Socket.last.accept();
  await flush();
  assert.deepEqual(asked, ["private-orders"]);
  const frame = Socket.last.sent[0];
  assert.equal(frame.type, "subscribe");
  assert.equal(frame.channel, "private-orders");
  assert.match(frame.token, /^[\w-]+\.[\w-]+\.[\w-]+$/);
  Socket.last.frame({ type: "subscribed", channel: "private-orders" });
  assert.equal(sub.state, "subscribed");
});

test("token refresh: a fresh token is sent before exp, then rescheduled from refreshed", async () => {
  let n = 0;
  const { clock, Socket, client } = setup({
    tokenRefreshMarginMs: 30_000,
    heartbeatMarginMs: 1e9, // keep the heartbeat out of this test
    getToken: async (channel) => {
      n += 1;
      return fakeJwt({ channel, exp: Math.floor(clock.now() / 1000) + 600 });
    },
  });
  client.subscribe("private-x", () => {});
  client.connect();
  Socket.last.accept(1e6);
  await flush();
  Socket.last.frame({ type: "subscribed", channel: "private-x" });
  const first = Socket.last.sent[0];
  clock.advance(569_000);
  await flush();
  assert.equal(Socket.last.sentOf("refresh").length, 0);
  clock.advance(1000); // 600 s - 30 s margin
  await flush();
  const refresh = Socket.last.sentOf("refresh");
  assert.equal(refresh.length, 1);
  assert.equal(refresh[0].channel, "private-x");
  assert.notEqual(refresh[0].token, first.token);
  Socket.last.frame({
    type: "refreshed", channel: "private-x", exp: Math.floor(clock.now() / 1000) + 600,
  });
  clock.advance(570_000);
  await flush();
  assert.equal(Socket.last.sentOf("refresh").length, 2);
  assert.equal(n, 3);
});

test("forbidden reaches the subscription once and is not retried in a loop", async () => {
  let asked = 0;
  const { clock, Socket, client, errors } = setup({
    getToken: async () => {
      asked += 1;
      return fakeJwt({ channel: "nope", exp: 1 });
    },
  });
  const sub = client.subscribe("private-secret", () => {});
  const subErrors = [];
  sub.on("error", (e) => subErrors.push(e));
  client.connect();
  Socket.last.accept();
  await flush();
  Socket.last.frame({
    type: "error", code: "forbidden", channel: "private-secret", message: "token does not name the channel",
  });
  assert.equal(subErrors.length, 1);
  assert.equal(subErrors[0].code, "forbidden");
  assert.equal(subErrors[0].channel, "private-secret");
  assert.equal(sub.state, "unsubscribed");
  assert.equal(client.subscription("private-secret"), undefined);
  assert.equal(errors.length, 0); // handled by the subscription's listener
  // Neither later on this connection nor after reconnects.
  for (let i = 0; i < 5; i++) {
    clock.advance(60_000);
    await flush();
    Socket.last.serverClose(1006);
    clock.advance(1000);
    Socket.last.accept();
    await flush();
  }
  assert.equal(asked, 1);
  const subscribes = Socket.instances.flatMap((ws) => ws.sentOf("subscribe"));
  assert.equal(subscribes.length, 1);
});

test("a subscribe over the connection's budget (rate_limited) is sent again 1 to 2 s later", () => {
  const { clock, Socket, client } = setup();
  const sub = client.subscribe("news", () => {});
  const subErrors = [];
  sub.on("error", (e) => subErrors.push(e.code));
  client.connect();
  Socket.last.accept();
  assert.equal(Socket.last.sentOf("subscribe").length, 1);
  Socket.last.frame({ type: "error", code: "rate_limited", channel: "news", message: "over budget" });
  assert.deepEqual(subErrors, ["rate_limited"]);
  assert.equal(sub.state, "subscribing");
  clock.advance(999);
  assert.equal(Socket.last.sentOf("subscribe").length, 1);
  clock.advance(1001);
  assert.equal(Socket.last.sentOf("subscribe").length, 2);
  Socket.last.frame({ type: "subscribed", channel: "news" });
  assert.equal(sub.state, "subscribed");
});

test("getToken missing or failing: the subscription's error, no frame, no loop", async () => {
  const { clock, Socket, client, errors } = setup();
  client.subscribe("private-a", () => {});
  client.connect();
  Socket.last.accept();
  await flush();
  assert.equal(errors.at(-1).code, "token_required"); // no listener on the sub: client error
  assert.deepEqual(Socket.last.sent, []);
  clock.advance(100_000);
  await flush();
  assert.equal(errors.filter((e) => e.code === "token_required").length, 1);
});

test("an error frame without a channel answers the oldest pending subscribe", () => {
  const { Socket, client, errors } = setup();
  client.connect();
  Socket.last.accept();
  const a = client.subscribe("a", () => {});
  const bad = client.subscribe("b", () => {});
  const got = [];
  bad.on("error", (e) => got.push(e.code));
  Socket.last.frame({ type: "subscribed", channel: "a" });
  Socket.last.frame({ type: "error", code: "too_many_subscriptions", message: "limit" });
  assert.deepEqual(got, ["too_many_subscriptions"]);
  assert.equal(a.state, "subscribed");
  assert.equal(bad.state, "unsubscribed");
  // Other errors without a channel go to the client.
  Socket.last.frame({ type: "error", code: "unknown_type", message: "?" });
  assert.equal(errors.at(-1).code, "unknown_type");
});

test("server-side end: unsubscribed with a reason reaches the subscription", () => {
  const { Socket, client } = setup();
  client.connect();
  Socket.last.accept();
  const got = [];
  const sub = client.subscribe("news", (m) => got.push(m));
  const reasons = [];
  sub.on("unsubscribed", (r) => reasons.push(r));
  Socket.last.frame({ type: "subscribed", channel: "news" });
  Socket.last.frame({ type: "unsubscribed", channel: "news", reason: "token_expired" });
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 1, id: "1" });
  assert.deepEqual(reasons, ["token_expired"]);
  assert.deepEqual(got, []);
  assert.equal(sub.state, "unsubscribed");
});

test("presence: members from subscribed, join and leave events", () => {
  const { Socket, client } = setup({ getToken: async () => "t.t.t" });
  client.connect();
  Socket.last.accept();
  const sub = client.subscribe("presence-room", () => {});
  sub.state = "subscribing"; // skip the token round trip
  const events = [];
  sub.on("presence", (e) => events.push(e));
  Socket.last.frame({
    type: "subscribed",
    channel: "presence-room",
    presence: { count: 2, members: [{ user_id: "u1", info: { n: 1 } }, { user_id: 10, info: {} }] },
  });
  assert.deepEqual(sub.members.map((m) => m.user_id), ["u1", "10"]);
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "join", user_id: "u2", info: { n: 2 } });
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "leave", user_id: "u1" });
  assert.deepEqual(events, [
    { action: "join", user_id: "u2", info: { n: 2 } },
    // A leave reports the info the member joined with (the server's leave has none).
    { action: "leave", user_id: "u1", info: { n: 1 } },
  ]);
  assert.deepEqual(sub.members, [{ user_id: "10", info: {} }, { user_id: "u2", info: { n: 2 } }]);
});

test("presence: a member without info is listed without it; repeated join and unknown leave change nothing", () => {
  const { Socket, client } = setup({ getToken: async () => "t.t.t" });
  client.connect();
  Socket.last.accept();
  const sub = client.subscribe("presence-room", () => {});
  sub.state = "subscribing";
  const events = [];
  sub.on("presence", (e) => events.push(e));
  Socket.last.frame({
    type: "subscribed",
    channel: "presence-room",
    presence: { count: 1, members: [{ user_id: "u1", info: { first: true } }] },
  });
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "join", user_id: "u2" });
  // The first connection's info stays the member's.
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "join", user_id: "u1", info: { first: false } });
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "leave", user_id: "nobody" });
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "wave", user_id: "u2" });
  assert.deepEqual(events, [{ action: "join", user_id: "u2" }]);
  assert.deepEqual(sub.members, [{ user_id: "u1", info: { first: true } }, { user_id: "u2" }]);
  assert.ok(!("info" in sub.members[1]));
});

test("presence: frames before subscribed are ignored; after a reconnect only the new list counts", async () => {
  const { Socket, client, clock } = setup({ getToken: async () => "t.t.t" });
  client.connect();
  Socket.last.accept();
  const sub = client.subscribe("presence-room", () => {});
  await flush();
  const events = [];
  const infos = [];
  sub.on("presence", (e) => events.push(e));
  sub.on("subscribed", (i) => infos.push(i));
  // The server's list already counts this join: the frame before it must not be applied twice.
  Socket.last.frame({ type: "presence", channel: "presence-room", action: "join", user_id: "u0" });
  Socket.last.frame({
    type: "subscribed",
    channel: "presence-room",
    presence: { count: 3, members: [{ user_id: "u0" }, { user_id: "me" }, { user_id: "gone" }] },
  });
  assert.deepEqual(sub.members.map((m) => m.user_id), ["u0", "me", "gone"]);
  Socket.last.serverClose(1006);
  assert.equal(client.state, "disconnected");
  assert.equal(sub.state, "pending");
  assert.deepEqual(sub.members, []);
  clock.advance(1000);
  Socket.last.accept();
  await flush();
  assert.equal(sub.state, "subscribing");
  // "gone" left while we were away; "new" joined.
  Socket.last.frame({
    type: "subscribed",
    channel: "presence-room",
    presence: { count: 3, members: [{ user_id: "u0" }, { user_id: "me" }, { user_id: "new" }] },
  });
  assert.deepEqual(sub.members.map((m) => m.user_id), ["u0", "me", "new"]);
  assert.equal(infos.length, 2);
  assert.deepEqual(events, []);
});

test("presence: a server-side end and presence_full leave no members behind", async () => {
  const { Socket, client } = setup({ getToken: async () => "t.t.t" });
  client.connect();
  Socket.last.accept();
  const sub = client.subscribe("presence-a", () => {});
  const full = client.subscribe("presence-b", () => {});
  await flush();
  Socket.last.frame({ type: "subscribed", channel: "presence-a", presence: { count: 1, members: [{ user_id: "me" }] } });
  assert.equal(sub.members.length, 1);
  Socket.last.frame({ type: "unsubscribed", channel: "presence-a", reason: "token_expired" });
  assert.deepEqual(sub.members, []);
  const errors = [];
  full.on("error", (e) => errors.push(e));
  Socket.last.frame({ type: "error", code: "presence_full", channel: "presence-b", message: "full" });
  assert.deepEqual(errors.map((e) => [e.code, e.channel]), [["presence_full", "presence-b"]]);
  assert.equal(full.state, "unsubscribed");
  assert.equal(client.subscription("presence-b"), undefined);
  assert.deepEqual(full.members, []);
});

test("trigger sends a client event only when subscribed, never queues", () => {
  const { Socket, client } = setup();
  const sub = client.subscribe("private-chat", () => {});
  assert.equal(sub.trigger("client-typing", { on: true }), false);
  assert.throws(() => sub.trigger("typing", {}), { code: "invalid_event" });
  client.connect();
  Socket.last.accept();
  sub.state = "subscribed";
  assert.equal(sub.trigger("client-typing", { on: true }), true);
  assert.deepEqual(Socket.last.sent.at(-1), {
    type: "client_event", channel: "private-chat", event: "client-typing", data: { on: true },
  });
  Socket.last.bufferedAmount = 10 << 20;
  assert.equal(sub.trigger("client-typing", {}), false);
});

test("a throwing message handler is reported, delivery goes on", () => {
  const { Socket, client, errors } = setup();
  client.connect();
  Socket.last.accept();
  let n = 0;
  client.subscribe("news", () => {
    n += 1;
    throw new Error("app bug");
  });
  Socket.last.frame({ type: "subscribed", channel: "news" });
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 1, id: "1" });
  Socket.last.frame({ type: "message", channel: "news", event: "e", data: 1, id: "2" });
  assert.equal(n, 2);
  assert.equal(errors.filter((e) => e.message === "app bug").length, 2);
});

test("invalid JSON from the server is an error event, not an exception", () => {
  const { Socket, client, errors } = setup();
  client.connect();
  Socket.last.accept();
  Socket.last.frame("{nope");
  assert.equal(errors.at(-1).code, "invalid_frame");
  assert.equal(client.state, "connected");
});

test("no WebSocket implementation: a clear error and state closed", () => {
  const { client, errors } = setup({ WebSocket: null });
  client._WebSocket = undefined;
  client.connect();
  assert.equal(errors.at(-1).code, "no_websocket");
  assert.equal(client.state, "closed");
});

test("close 1013 waits retry_after seconds plus jitter, then reconnects", () => {
  const { clock, Socket, client, errors } = setup({ random: () => 0.25 });
  client.connect();
  Socket.last.serverClose(1013, "retry_after=7");
  assert.equal(client.state, "disconnected");
  assert.equal(errors.at(-1).code, "try_again_later");
  assert.equal(errors.at(-1).closeCode, 1013);
  // 7 s plus 0.25 of a second of jitter, not the 100-200 ms backoff.
  assert.deepEqual(clock.pending(), [7250]);
  clock.advance(7249);
  assert.equal(Socket.instances.length, 1);
  clock.advance(1);
  assert.equal(Socket.instances.length, 2);
  // Without a readable retry_after: the usual backoff.
  Socket.last.serverClose(1013, "busy");
  assert.ok(clock.pending()[0] <= 1000, `${clock.pending()}`);
});

test("close 1013 waits are jittered between clients", () => {
  const waits = new Set();
  for (const r of [0, 0.3, 0.6, 0.9]) {
    const { clock, Socket, client } = setup({ random: () => r });
    client.connect();
    Socket.last.serverClose(1013, "retry_after=2");
    waits.add(clock.pending()[0]);
    assert.ok(clock.pending()[0] >= 2000 && clock.pending()[0] <= 3000);
  }
  assert.equal(waits.size, 4);
});

test("after 1001 the first reconnect is spread over a few seconds, not half a second", () => {
  const delays = [];
  for (const r of [0, 0.5, 1]) {
    const { clock, Socket, client } = setup({ random: () => r, minReconnectDelayMs: 500, maxReconnectDelayMs: 20000 });
    client.connect();
    Socket.last.accept();
    clock.advance(60_000);
    Socket.last.serverClose(1001, "server shutting down");
    delays.push(clock.pending()[0]);
  }
  // Uniform over [500, 3000] ms (shutdownReconnectSpreadMs), where the backoff alone
  // would give [500, 1000] ms.
  assert.deepEqual(delays, [500, 1750, 3000]);
  const { clock, Socket, client } = setup({ random: () => 1, shutdownReconnectSpreadMs: 8000 });
  client.connect();
  Socket.last.accept();
  Socket.last.serverClose(1001);
  assert.deepEqual(clock.pending(), [8000]);
});
