// The same client module on Node 20 (no global WebSocket: the `ws` package is passed in)
// against the real ringcast binary.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Ringcast } from "../../clients/js/ringcast.js";
import { startServer, createProject, publish, waitFor, cleanupAll, onCleanup, cli } from "./helpers.mjs";

after(cleanupAll);

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
  class Counting extends WebSocket {
    constructor(url) {
      super(url);
      opened += 1;
    }
  }
  const client = new Ringcast(server.wsUrl, {
    key: "pk_unknown",
    WebSocket: Counting,
    minReconnectDelayMs: 100,
    maxReconnectDelayMs: 400,
  });
  onCleanup(() => client.close());
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
  class Killable extends WebSocket {
    constructor(url) {
      super(url);
      sockets.push(this);
    }
  }
  const client = new Ringcast(server.wsUrl, {
    key: project.public,
    WebSocket: Killable,
    minReconnectDelayMs: 200,
    maxReconnectDelayMs: 400,
  });
  onCleanup(() => client.close());
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
