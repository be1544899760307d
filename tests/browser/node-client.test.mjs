// The same client module on Node 20 (no global WebSocket: the `ws` package is passed in)
// against the real ringcast binary.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Ringcast } from "../../clients/js/ringcast.js";
import { startServer, createProject, publish, waitFor, cleanupAll, onCleanup } from "./helpers.mjs";

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
