// The same client module on Node 20 (no global WebSocket: the `ws` package is passed in)
// against the real ringcast binary.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Ringcast } from "../../clients/js/ringcast.js";
import {
  startServer, createProject, publish, apiGet, signToken, waitFor, cleanupAll, onCleanup, cli,
} from "./helpers.mjs";

after(cleanupAll);

/**
 * A client of `server` with `key` whose WebSocket (the ws package) calls `onOpen(socket)`
 * for each socket it opens, reconnecting after `min`..`max` ms; closed at cleanup.
 */
function watchedClient(server, key, onOpen, [min, max]) {
  class Watched extends WebSocket {
    constructor(url) {
      super(url);
      onOpen(this);
    }
  }
  const client = new Ringcast(server.wsUrl, {
    key,
    WebSocket: Watched,
    minReconnectDelayMs: min,
    maxReconnectDelayMs: max,
  });
  onCleanup(() => client.close());
  return client;
}

test("Node with the ws package: subscribe, receive, unsubscribe, close", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const client = new Ringcast(server.wsUrl, { key: project.public, WebSocket });
  onCleanup(() => client.close());
  const states = [];
  const errors = [];
  const messages = [];
  client.on("state", (s) => states.push(s));
  client.on("error", (e) => errors.push(e));
  let subscribed = 0;
  const sub = client.subscribe("news", (m) => messages.push(m));
  sub.on("subscribed", () => (subscribed += 1));
  client.connect();
  await waitFor(() => subscribed === 1, { message: "subscribed" });

  const res = await publish(server, project.secret, "news", "e", { a: [1, "x"] });
  assert.equal(res.status, 202);
  await waitFor(() => messages.length === 1, { message: "the message" });
  assert.deepEqual(messages[0], { channel: "news", event: "e", data: { a: [1, "x"] }, id: res.body.id });

  sub.unsubscribe();
  let other = 0;
  client.subscribe("other", () => {}).on("subscribed", () => (other += 1));
  await waitFor(() => other === 1, { message: "other subscribed" });
  await publish(server, project.secret, "news", "e", { a: 2 });
  assert.equal(messages.length, 1);

  client.close();
  assert.equal(client.state, "closed");
  assert.deepEqual(states, ["connecting", "connected", "closed"]);
  assert.deepEqual(errors, []);
});

test("Node: an unknown key is refused at the upgrade and retried with backoff, never in a loop", async () => {
  const server = await startServer();
  let opened = 0;
  const client = watchedClient(server, "pk_unknown", () => (opened += 1), [100, 400]);
  const errors = [];
  client.on("error", (e) => errors.push(e));
  const started = Date.now();
  client.connect();
  await waitFor(() => opened >= 3, { message: "three attempts" });
  const elapsed = Date.now() - started;
  client.close();
  // Attempts 2 and 3 waited at least 100 ms each.
  assert.ok(elapsed >= 200, `3 attempts in ${elapsed} ms`);
  assert.ok(errors.length >= 2 && errors.every((e) => e.code === "connection_lost"), errors.map((e) => e.code).join());
  // Node's ws says why: the upgrade was refused with 401.
  assert.match(errors[0].message, /401/);
  assert.equal(client.state, "closed");
});

test("Node: after a lost connection the client recovers the missed messages once, in order", async () => {
  const server = await startServer();
  const project = await createProject(server, "recover");
  await cli(server.dataDir, "project", "set-history", project.id, "100/600s");
  await waitFor(async () => (await publish(server, project.secret, "warm", "e", "x")).body.offset !== undefined, {
    message: "history to be on",
  });
  const sockets = [];
  const client = watchedClient(server, project.public, (socket) => sockets.push(socket), [200, 400]);
  const messages = [];
  const infos = [];
  const sub = client.subscribe("news", (m) => messages.push(m));
  sub.on("subscribed", (info) => infos.push(info));
  client.connect();
  await waitFor(() => infos.length === 1, { message: "subscribed" });
  assert.equal(infos[0].offset, 0);
  for (let i = 1; i <= 3; i++) await publish(server, project.secret, "news", "e", { i });
  await waitFor(() => messages.length === 3, { message: "three live messages" });

  // The connection dies (as on a network loss); messages are published meanwhile.
  sockets.at(-1).terminate();
  await waitFor(() => client.state !== "connected", { message: "the client to notice" });
  for (let i = 4; i <= 6; i++) await publish(server, project.secret, "news", "e", { i });
  await waitFor(() => infos.length === 2, { message: "subscribed again" });
  assert.equal(infos[1].recovered, true, JSON.stringify(infos[1]));
  assert.equal(infos[1].offset, 6);
  await publish(server, project.secret, "news", "e", { i: 7 });
  await waitFor(() => messages.length === 7, { message: "replay then live" });
  assert.deepEqual(messages.map((m) => m.offset), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(messages.map((m) => m.data.i), [1, 2, 3, 4, 5, 6, 7]);
  assert.equal(new Set(messages.map((m) => m.epoch)).size, 1);
  assert.equal(sockets.length, 2);
});

test("Node: presence members, joins and leaves, and a token that expires ends the subscription", async () => {
  const server = await startServer();
  const project = await createProject(server, "presence");
  const now = () => Math.floor(Date.now() / 1000);
  /** A client of `user` whose tokens expire `ttl` seconds after they are made. */
  const clientOf = (user, info, ttl) => {
    // The first token is reused: a client cannot extend it (refresh says so), so the
    // subscription ends at exp + 5 s.
    let token;
    const client = new Ringcast(server.wsUrl, {
      key: project.public,
      WebSocket,
      getToken: (channel) =>
        (token ??= signToken(project.tokenSecret, { channel, sub: user, info, exp: now() + ttl })),
    });
    onCleanup(() => client.close());
    const seen = { presence: [], ended: [], errors: [], subscribed: 0 };
    const sub = client.subscribe("presence-room", () => {});
    sub.on("presence", (e) => seen.presence.push(e));
    sub.on("unsubscribed", (r) => seen.ended.push(r));
    sub.on("error", (e) => seen.errors.push(e.code));
    sub.on("subscribed", () => (seen.subscribed += 1));
    client.connect();
    return { client, sub, seen };
  };
  const u1 = clientOf("u1", { n: 1 }, 600);
  await waitFor(() => u1.seen.subscribed === 1, { message: "u1 subscribed" });
  const u2 = clientOf("u2", { n: 2 }, 2);
  await waitFor(() => u2.seen.subscribed === 1, { message: "u2 subscribed" });
  assert.deepEqual(u2.sub.members, [{ user_id: "u1", info: { n: 1 } }, { user_id: "u2", info: { n: 2 } }]);
  await waitFor(() => u1.seen.presence.length === 1, { message: "u1 sees u2 join" });
  assert.deepEqual(u1.seen.presence, [{ action: "join", user_id: "u2", info: { n: 2 } }]);

  // u2's token runs out: the server ends the subscription (token_expired) and u2 leaves.
  await waitFor(() => u2.seen.ended.length === 1, { timeout: 15000, message: "u2's token to expire" });
  assert.deepEqual(u2.seen.ended, ["token_expired"]);
  assert.deepEqual(u2.seen.errors, ["token_not_refreshed"]);
  assert.equal(u2.sub.state, "unsubscribed");
  assert.deepEqual(u2.sub.members, []);
  await waitFor(() => u1.seen.presence.length === 2, { message: "u1 sees u2 leave" });
  assert.deepEqual(u1.seen.presence[1], { action: "leave", user_id: "u2", info: { n: 2 } });
  assert.deepEqual(u1.sub.members, [{ user_id: "u1", info: { n: 1 } }]);
  assert.equal(u2.client.state, "connected");

  // u1 unsubscribes: the server's list is empty.
  u1.sub.unsubscribe();
  await waitFor(
    async () => (await apiGet(server, project.secret, "/api/v1/presence?channel=presence-room")).body.count === 0,
    { message: "the member list to empty" },
  );
  assert.deepEqual(u1.seen.ended, []);
  assert.deepEqual(u1.seen.errors, []);
});

test("Node: a node over max_upgrades_per_second closes with 1013 retry_after; the client waits that long, then connects", async () => {
  const server = await startServer({ config: "max_upgrades_per_second = 1\n" });
  const project = await createProject(server);
  // Take the node's one upgrade of this second.
  const first = new WebSocket(`${server.wsUrl}?key=${project.public}`);
  onCleanup(() => first.terminate());
  await new Promise((resolve, reject) => {
    first.once("message", resolve);
    first.once("error", reject);
  });
  const opened = [];
  const client = watchedClient(server, project.public, () => opened.push(Date.now()), [50, 100]);
  const errors = [];
  client.on("error", (e) => errors.push({ e, at: Date.now() }));
  client.connect();
  await waitFor(() => client.state === "connected", { timeout: 20000, message: "connected after the wait" });
  const refused = errors.find(({ e }) => e.closeCode === 1013);
  assert.ok(refused, JSON.stringify(errors.map(({ e }) => e.message)));
  assert.equal(refused.e.code, "try_again_later");
  const m = /^retry_after=(\d+)$/.exec(refused.e.reason);
  assert.ok(m, refused.e.reason);
  const seconds = Number(m[1]);
  assert.ok(seconds >= 1 && seconds <= 10, refused.e.reason);
  // The next attempt came no sooner than retry_after (the backoff alone is 50-100 ms).
  const next = opened.find((t) => t >= refused.at);
  assert.ok(next - refused.at >= seconds * 1000 - 20, `retried after ${next - refused.at} ms`);
});
