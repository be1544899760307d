// pusher-js (its Node build, pinned in package.json) against the real ringcast binary
// over the Pusher Channels protocol 7 (`/app/{key}`), beside native clients
// (`/api/v1/ws`) and native publishes: what docs/design/pusher.md section 6.1 lists that
// needs only the WebSocket. Private and presence channels are authorised by a tiny auth
// endpoint using the npm `pusher` SDK's authorizeChannel, as an application backend
// would. One server for the file; the heartbeat test starts one with heartbeat_s = 1, the
// shutdown test two on one port (a rolling restart).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { startServer, cli, apiGet, signToken, waitFor, cleanupAll } from "./helpers.mjs";
import {
  pusherServer, pusherProject, nativePublish, nativeClient, waitPusherKey, connectPusher, subscribePusher,
  eventsNamed, SOCKET_ID,
} from "./pusher-helpers.mjs";

let server, project, auth;

before(async () => {
  ({ server, project, auth } = await pusherServer());
});

after(cleanupAll);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A pusher-js client of this file's server (see connectPusher). */
const connect = (opts = {}) => connectPusher({ server, key: project.public, auth, ...opts });

/** Two pusher-js clients `a` and `b`, each subscribed to `channel` (`sa`, `sb`). */
async function twoSubscribed(channel) {
  const [a, b] = [await connect(), await connect()];
  return { a, b, sa: await subscribe(a, channel), sb: await subscribe(b, channel) };
}
const subscribe = subscribePusher;

test("connect: state connected within 5 s, socket ids of Pusher's form for both protocols", async () => {
  const c = await connect();
  assert.match(c.p.connection.socket_id, SOCKET_ID);
  assert.deepEqual(c.errors, []);
  const native = await nativeClient(server, project.public);
  assert.match(native.connectionId, SOCKET_ID);
  assert.notEqual(native.connectionId, c.p.connection.socket_id);
});

test("public channel: a native publish of an object arrives as the object, of a string as the string; native and pusher-js both get it", async () => {
  const c = await connect();
  const s = await subscribe(c, "orders");
  assert.equal(s.succeeded, 1);
  assert.deepEqual(s.errors, []);
  const native = await nativeClient(server, project.public);
  await native.subscribe("orders");

  assert.equal((await nativePublish(server, project, "orders", "order.created", { id: 42, items: ["a", "b"] })).status, 202);
  await waitFor(() => eventsNamed(s, "order.created").length === 1, { message: "the object in pusher-js" });
  assert.deepEqual(eventsNamed(s, "order.created")[0].data, { id: 42, items: ["a", "b"] });

  assert.equal((await nativePublish(server, project, "orders", "note", "hello there")).status, 202);
  await waitFor(() => eventsNamed(s, "note").length === 1, { message: "the string in pusher-js" });
  assert.equal(eventsNamed(s, "note")[0].data, "hello there");

  // The native client got the same two publishes, its data as published.
  await waitFor(() => native.messages("orders").length === 2, { message: "both in the native client" });
  assert.deepEqual(
    native.messages("orders").map((m) => [m.event, m.data]),
    [["order.created", { id: 42, items: ["a", "b"] }], ["note", "hello there"]],
  );
  assert.deepEqual(s.events.map((e) => e.event), ["order.created", "note"]);
  assert.deepEqual(c.errors, []);
});

test("private channel: authorised by the SDK's authorizeChannel; a wrong secret is a 401 subscription_error and nothing is delivered", async () => {
  const good = await connect();
  const s = await subscribe(good, "private-orders");
  assert.deepEqual(s.errors, []);
  assert.equal(s.succeeded, 1);
  assert.ok(auth.requests.some((r) => r.channel_name === "private-orders" && r.socket_id === good.p.connection.socket_id));

  const bad = await connect({ bad: true });
  const sb = await subscribe(bad, "private-orders");
  assert.equal(sb.succeeded, 0);
  assert.equal(sb.errors.length, 1);
  assert.equal(sb.errors[0].status, 401, JSON.stringify(sb.errors[0]));
  assert.equal(sb.errors[0].type, "AuthError");
  // The refusal came from the server as a frame (the auth endpoint answered 200).
  const frame = bad.frames.find((f) => f.event === "pusher:subscription_error");
  assert.ok(frame, JSON.stringify(bad.frames));
  assert.equal(frame.channel, "private-orders");
  assert.equal(frame.data.status, 401);
  const pub = await subscribe(bad, "orders-bad-client");

  assert.equal((await nativePublish(server, project, "private-orders", "secret", { n: 1 })).status, 202);
  await waitFor(() => eventsNamed(s, "secret").length === 1, { message: "the private message" });
  assert.deepEqual(eventsNamed(s, "secret")[0].data, { n: 1 });
  // A later publish to a channel the refused client holds reaches it after anything
  // sent to it before: the private message never did.
  assert.equal((await nativePublish(server, project, "orders-bad-client", "after", {})).status, 202);
  await waitFor(() => pub.events.length === 1, { message: "the public message to the refused client" });
  await sleep(100);
  assert.deepEqual(sb.events, []);
  assert.equal(bad.p.connection.state, "connected");
});

test("presence: pusher-js and native clients in one member set; added/removed once per user; numeric id 10 is \"10\"", async () => {
  const ROOM = "presence-room";
  const subscribers = async () =>
    (await apiGet(server, project.secret, `/api/v1/channels/info?channel=${ROOM}`)).body.subscribers;

  const alice = await connect({ user: "alice" });
  const sa = await subscribe(alice, ROOM);
  assert.deepEqual(sa.errors, []);
  assert.equal(sa.channel.members.count, 1);
  assert.equal(sa.channel.members.me.id, "alice");

  // A native member, its token signed with the project's token secret.
  const carol = await nativeClient(server, project.public);
  const token = signToken(project.tokenSecret, {
    channel: ROOM, sub: "carol", info: { name: "Carol" }, exp: Math.floor(Date.now() / 1000) + 600,
  });
  const subscribed = await carol.subscribe(ROOM, token);
  assert.deepEqual(subscribed.presence, {
    count: 2,
    members: [
      { user_id: "alice", info: { id: "alice", name: "User alice" } },
      { user_id: "carol", info: { name: "Carol" } },
    ],
  });
  await waitFor(() => sa.added.length === 1, { message: "alice sees carol" });
  assert.deepEqual(sa.added[0], { id: "carol", info: { name: "Carol" } });

  // User 10, whose channel_data has the number 10.
  const bob = await connect({ user: 10, numeric: true });
  const sbob = await subscribe(bob, ROOM);
  assert.deepEqual(sbob.errors, []);
  const ok = bob.frames.find((f) => f.event === "pusher_internal:subscription_succeeded" && f.channel === ROOM);
  assert.ok(ok, JSON.stringify(bob.frames));
  assert.equal(ok.data.presence.count, 3);
  assert.deepEqual([...ok.data.presence.ids].sort(), ["10", "alice", "carol"]);
  assert.deepEqual(ok.data.presence.hash, {
    alice: { id: "alice", name: "User alice" },
    carol: { name: "Carol" },
    10: { id: "10", name: "User 10" },
  });
  assert.equal(sbob.channel.members.count, 3);
  await waitFor(() => sa.added.length === 2, { message: "alice sees user 10" });
  assert.deepEqual(sa.added[1], { id: "10", info: { id: "10", name: "User 10" } });
  assert.equal(typeof sa.added[1].id, "string");
  assert.equal(sa.channel.members.count, 3);
  const addedFrame = alice.frames.find((f) => f.event === "pusher_internal:member_added" && f.data.user_id === "10");
  assert.ok(addedFrame, "member_added carries user_id \"10\" as a string");
  await waitFor(() => carol.presence(ROOM).length === 1, { message: "carol sees user 10" });
  assert.deepEqual(carol.presence(ROOM)[0], {
    type: "presence", channel: ROOM, action: "join", user_id: "10", info: { id: "10", name: "User 10" },
  });

  // Alice's second connection is not another member.
  const alice2 = await connect({ user: "alice" });
  const sa2 = await subscribe(alice2, ROOM);
  assert.equal(sa2.channel.members.count, 3);
  assert.equal(await subscribers(), 4);

  // User 10 leaves: removed once, everywhere.
  bob.p.disconnect();
  await waitFor(() => sa.removed.length === 1 && sa2.removed.length === 1, { message: "user 10 removed" });
  assert.deepEqual(sa.removed[0], { id: "10", info: { id: "10", name: "User 10" } });
  await waitFor(() => carol.presence(ROOM).length === 2, { message: "carol sees user 10 leave" });
  assert.deepEqual(carol.presence(ROOM)[1], { type: "presence", channel: ROOM, action: "leave", user_id: "10" });
  assert.equal(sa.channel.members.count, 2);

  // One of alice's two connections closes: alice is still there.
  alice2.p.disconnect();
  await waitFor(async () => (await subscribers()) === 2, { message: "alice's second connection gone" });
  // Carol leaves: alice sees that, and only that.
  carol.close();
  await waitFor(() => sa.removed.length === 2, { message: "alice sees carol leave" });
  assert.deepEqual(sa.removed.map((m) => m.id), ["10", "carol"]);
  assert.deepEqual(sa.added.map((m) => m.id), ["carol", "10"]);
  assert.equal(sa.channel.members.count, 1);
  assert.deepEqual(carol.presence(ROOM).map((p) => [p.action, p.user_id]), [["join", "10"], ["leave", "10"]]);
  assert.deepEqual(alice.errors, []);
});

test("client events: to the other pusher-js client and the native client, never the sender; 11 in a second → error 4301, the connection stays", async () => {
  const CHAT = "private-chat";
  const { a, b, sa, sb } = await twoSubscribed(CHAT);
  assert.deepEqual([sa.errors, sb.errors], [[], []]);
  const native = await nativeClient(server, project.public);
  await native.subscribe(CHAT, signToken(project.tokenSecret, { channel: CHAT, exp: Math.floor(Date.now() / 1000) + 600 }));

  // The switch was turned on in before(); make sure the server applied it (≤ 5 tries/s).
  let tries = 0;
  await waitFor(
    () => {
      if (eventsNamed(sb, "client-x").length > 0) return true;
      tries += 1;
      sa.channel.trigger("client-x", { try: tries });
      return false;
    },
    { interval: 200, timeout: 5000, message: `a client event to get through (errors ${JSON.stringify(a.errors)})` },
  );
  await waitFor(() => native.messages(CHAT).length > 0, { message: "the client event in the native client" });
  const first = native.messages(CHAT)[0];
  assert.equal(first.event, "client-x");
  assert.equal(first.data.try, eventsNamed(sb, "client-x")[0].data.try);
  assert.equal(typeof first.id, "string");
  // Attempts before the switch was applied were refused without a code.
  assert.ok(a.errors.every((e) => e.data?.code == null), JSON.stringify(a.errors));

  // Let the 1 s window empty, then 11 at once: 10 get through, the 11th is refused with
  // 4301, and the connection stays.
  await sleep(1100);
  const before = { b: eventsNamed(sb, "client-x").length, native: native.messages(CHAT).length, errors: a.errors.length };
  for (let i = 0; i < 11; i += 1) assert.equal(sa.channel.trigger("client-x", { burst: i }), true);
  await waitFor(() => a.errors.length > before.errors, { message: "the 4301 error" });
  const err = a.errors[a.errors.length - 1];
  assert.equal(err.type, "PusherError", JSON.stringify(err));
  assert.equal(err.data.code, 4301, JSON.stringify(err));
  await waitFor(() => eventsNamed(sb, "client-x").length === before.b + 10, { message: "10 of the burst in b" });
  await waitFor(() => native.messages(CHAT).length === before.native + 10, { message: "10 of the burst in native" });
  assert.deepEqual(
    eventsNamed(sb, "client-x").slice(before.b).map((e) => e.data.burst),
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
  );
  assert.equal(a.p.connection.state, "connected");
  assert.equal(a.errors.length, before.errors + 1);

  // The other direction, after the window: b's event reaches a, not b.
  await sleep(1100);
  sb.channel.trigger("client-y", "from b");
  await waitFor(() => eventsNamed(sa, "client-y").length === 1, { message: "b's event in a" });
  assert.equal(eventsNamed(sa, "client-y")[0].data, "from b");
  // A native publish reaches every client after what was sent before it: the senders
  // never got their own events.
  assert.equal((await nativePublish(server, project, CHAT, "after", {})).status, 202);
  await waitFor(() => eventsNamed(sa, "after").length === 1 && eventsNamed(sb, "after").length === 1, {
    message: "the publish after",
  });
  assert.deepEqual(eventsNamed(sa, "client-x"), []);
  assert.deepEqual(eventsNamed(sb, "client-y"), []);
  assert.equal(a.p.connection.state, "connected");
  assert.deepEqual(a.states, ["connected"]);
});

test("socket_id exclusion: a native publish with a connection's socket_id skips exactly that connection", async () => {
  const NEWS = "news";
  const { a, b, sa, sb } = await twoSubscribed(NEWS);
  const native = await nativeClient(server, project.public);
  await native.subscribe(NEWS);

  const pub = (event, extra) => nativePublish(server, project, NEWS, event, { e: event }, extra);
  assert.equal((await pub("skip-a", { socket_id: a.p.connection.socket_id })).status, 202);
  assert.equal((await pub("skip-native", { socket_id: native.connectionId })).status, 202);
  assert.equal((await pub("all")).status, 202);
  await waitFor(() => eventsNamed(sa, "all").length === 1 && eventsNamed(sb, "all").length === 1, { message: "the last publish" });
  await waitFor(() => native.messages(NEWS).some((m) => m.event === "all"), { message: "the last publish, native" });
  assert.deepEqual(sa.events.map((e) => e.event), ["skip-native", "all"]);
  assert.deepEqual(sb.events.map((e) => e.event), ["skip-a", "skip-native", "all"]);
  assert.deepEqual(native.messages(NEWS).map((m) => m.event), ["skip-a", "all"]);
});

test("a revoked key: error 4001 and the client stays disconnected (no reconnect)", async (t) => {
  // On a refusal pusher-js closes its socket once more after it closed; faye-websocket
  // (bundled in pusher-js's Node build) then arms a 30 s close timer that nothing clears,
  // which would keep this test process alive 30 s after the last test. Such timers (30 s
  // exactly; no test waits on one) are unref'd while this test runs.
  const setTimeoutBefore = globalThis.setTimeout;
  globalThis.setTimeout = (fn, ms, ...args) => {
    const timer = setTimeoutBefore(fn, ms, ...args);
    if (ms === 30000) timer.unref?.();
    return timer;
  };
  t.after(() => {
    globalThis.setTimeout = setTimeoutBefore;
  });
  const created = await cli(server.dataDir, "key", "create", project.id, "--kind", "public");
  await waitPusherKey(server, created.key);
  const c = await connect({ key: created.key });
  await subscribe(c, "orders");
  await cli(server.dataDir, "key", "revoke", created.key);
  await waitFor(() => c.errors.some((e) => e.data?.code === 4001), {
    message: `error 4001 (errors ${JSON.stringify(c.errors)}, states ${c.states.join(" ")})`,
  });
  await waitFor(() => ["disconnected", "failed", "unavailable"].includes(c.p.connection.state), {
    message: "a final state",
  });
  const states = c.states.length;
  // pusher-js would retry a closed connection after 1 s: 3 s without a state change.
  await sleep(3000);
  assert.deepEqual(c.states.slice(states), [], `states: ${c.states.join(" ")}`);
  assert.notEqual(c.p.connection.state, "connected");
  assert.deepEqual(c.states, ["connected", "disconnected"]);
});

test("heartbeat: activity_timeout is heartbeat_s; an idle client pings and gets pongs, and is not dropped", async () => {
  const hb = await startServer({ config: "heartbeat_s = 1\n" });
  const hbProject = await pusherProject(hb, "heartbeat");
  // The handshake as sent.
  const raw = new WebSocket(`ws://${hb.addr}/app/${hbProject.public}?protocol=7&client=js&version=8.6.0&flash=false`);
  const established = await new Promise((resolve, reject) => {
    raw.once("message", (d) => resolve(JSON.parse(String(d))));
    raw.once("error", reject);
  });
  raw.close();
  assert.equal(established.event, "pusher:connection_established");
  const data = JSON.parse(established.data);
  assert.equal(data.activity_timeout, 1);
  assert.match(data.socket_id, SOCKET_ID);

  const c = await connectPusher({ server: hb, key: hbProject.public });
  assert.equal(c.p.connection.activityTimeout, 1000);
  const socketId = c.p.connection.socket_id;
  await sleep(4000);
  const pongs = c.frames.filter((f) => f.event === "pusher:pong").length;
  assert.ok(pongs >= 2, `${pongs} pong(s) in 4 s: ${JSON.stringify(c.frames)}`);
  // pusher-js was "connecting" before connect() could listen: "connected" is the first change seen.
  assert.deepEqual({ states: [...c.states], errors: [...c.errors] }, { states: ["connected"], errors: [] });
  assert.equal(c.p.connection.state, "connected");
  assert.equal(c.p.connection.socket_id, socketId);
  assert.deepEqual(c.errors, []);
});

test("server shutdown: close 4200, and pusher-js reconnects at once (to the next server on the port) and subscribes again", async () => {
  // One worker: its listener is closed before its sockets get 4200, so the immediate
  // retry cannot reach a listener of this server. With two workers it once stayed
  // "connecting" (pusher-js waits out a 15 s connect timeout when an attempt gets no
  // answer), likely a retry queued at the other worker's listener just before it closed.
  const first = await startServer({ workers: 1 });
  const p = await pusherProject(first, "restart");
  const c = await connectPusher({ server: first, key: p.public });
  const s = await subscribePusher(c, "orders");
  const socketId = c.p.connection.socket_id;
  // The next server listens on the same port before the first stops (the listeners are
  // SO_REUSEPORT), as in a rolling restart: pusher-js's immediate retry finds it.
  const next = await startServer({ dataDir: first.dataDir, listen: first.addr });
  const changes = [];
  c.p.connection.bind("state_change", (st) => changes.push([st.current, Date.now()]));
  const stopped = Date.now();
  await first.stop();
  await waitFor(() => c.p.connection.state === "connected" && c.p.connection.socket_id !== socketId, {
    timeout: 5000,
    message: `reconnected (states ${c.states.join(" ")}, errors ${JSON.stringify(c.errors)})`,
  });
  // The close said 4200: pusher-js reports it and retries now (a plain close waits 1 s).
  // (pusher-js reports the close's error twice: as itself and wrapped in a WebSocketError.)
  const codes = c.errors.map((e) => e.data?.code ?? e.error?.data?.code);
  assert.ok(
    codes.length > 0 && codes.every((code) => code === 4200),
    `expected the close code 4200 (an error event with data.code 4200); pusher-js reported ${JSON.stringify(c.errors)}`,
  );
  assert.deepEqual(changes.map(([st]) => st), ["connecting", "connected"]);
  assert.ok(changes[0][1] - stopped < 900, `pusher-js reconnected ${changes[0][1] - stopped} ms after the stop began`);
  await waitFor(() => s.succeeded === 2, { message: "subscribed again" });
  // Node's fetch may hand this publish a pooled connection to the same address that the
  // first server closed: try again on a network error.
  await waitFor(async () => (await nativePublish(next, p, "orders", "back", { ok: true }).catch(() => ({}))).status === 202, {
    message: "a publish to the next server",
  });
  await waitFor(() => eventsNamed(s, "back").length >= 1, { message: "a message after the restart" });
});
