// The JavaScript client's connection token (issue 25, contract 1.3 "Users") on Node 20
// against the real ringcast binary: the user it names, a close 4011 at exp + 5 s answered
// by a fresh token and a reconnect, and a close 4010 (the application disconnected the
// user through the REST API) ending in state closed with no reconnect.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Ringcast } from "../../clients/js/ringcast.js";
import { startServer, createProject, signToken, waitFor, cleanupAll, onCleanup } from "./helpers.mjs";

after(cleanupAll);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => Math.floor(Date.now() / 1000);

test("4011 at exp + 5 s: a fresh connection token and a reconnect; 4010: closed, no reconnect", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const issued = [];
  const errors = [];
  // Until the first 4011 the token function keeps giving the first token, which ends in
  // 2 s: its refresh would not extend it, so none is sent and the server closes at exp + 5 s.
  const client = new Ringcast(server.wsUrl, {
    key: project.public,
    WebSocket,
    minReconnectDelayMs: 50,
    maxReconnectDelayMs: 200,
    token: () => {
      if (issued.length > 0 && !errors.some((e) => e.closeCode === 4011)) return issued[0];
      const life = issued.length === 0 ? 2 : 600;
      const token = signToken(project.tokenSecret, { sub: "ann", exp: now() + life });
      issued.push(token);
      return token;
    },
  });
  onCleanup(() => client.close());
  const states = [];
  client.on("state", (s) => states.push(s));
  client.on("error", (e) => errors.push(e));
  client.connect();
  await waitFor(() => client.state === "connected", { message: "connected" });
  assert.equal(client.userId, "ann");

  await waitFor(() => errors.some((e) => e.closeCode === 4011), { timeout: 15000, message: "4011" });
  await waitFor(() => client.state === "connected", { timeout: 5000, message: "connected again" });
  assert.ok(issued.length >= 2, "a new token for the reconnect");
  assert.equal(client.userId, "ann");

  const res = await fetch(`${server.url}/api/v1/users/ann/disconnect`, {
    method: "POST",
    headers: { "X-Api-Key": project.secret },
  });
  assert.equal(res.status, 202);
  await waitFor(() => client.state === "closed", { timeout: 5000, message: "closed after 4010" });
  assert.equal(errors.at(-1).closeCode, 4010);
  assert.equal(errors.at(-1).code, "disconnected");
  const opened = states.filter((s) => s === "connecting").length;
  await sleep(1000);
  assert.equal(states.filter((s) => s === "connecting").length, opened, "no reconnect after 4010");
});
