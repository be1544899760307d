// The connection token (contract 1.3, "Users"): the `token` option, its refresh, 4010 and 4011.

import { test } from "node:test";
import assert from "node:assert/strict";
import { fakeJwt, flush } from "../test-helpers/fakes.js";
import { setup } from "../test-helpers/setup.js";

test("connection token: fetched before the socket, sent as ?token=, user_id from connected", async () => {
  let n = 0;
  const { clock, Socket, client } = setup({
    heartbeatMarginMs: 1e9,
    token: async () => {
      n += 1;
      return fakeJwt({ sub: "ann", exp: Math.floor(clock.now() / 1000) + 600 });
    },
  });
  client.connect();
  assert.equal(Socket.instances.length, 0, "no socket before the token");
  await flush();
  assert.equal(Socket.instances.length, 1);
  const sent = new URL(Socket.last.url).searchParams.get("token");
  assert.ok(sent && sent.split(".").length === 3);
  Socket.last.readyState = 1;
  Socket.last.frame({ type: "connected", connection_id: "1.1", heartbeat_s: 1e6, user_id: "ann" });
  assert.equal(client.userId, "ann");
  // Refreshed 30 s before exp, without a channel; the answer reschedules.
  clock.advance(570_000);
  await flush();
  const refresh = Socket.last.sentOf("refresh");
  assert.equal(refresh.length, 1);
  assert.equal(refresh[0].channel, undefined);
  assert.notEqual(refresh[0].token, sent);
  Socket.last.frame({ type: "refreshed", exp: Math.floor(clock.now() / 1000) + 600 });
  clock.advance(570_000);
  await flush();
  assert.equal(Socket.last.sentOf("refresh").length, 2);
  assert.equal(n, 3);
});

test("close 4010 (disconnected by the application) ends in closed with no reconnect", () => {
  const { clock, Socket, client, errors } = setup({ token: fakeJwt({ sub: "ann", exp: 4e9 }) });
  client.connect();
  return flush().then(() => {
    Socket.last.accept();
    Socket.last.serverClose(4010, "disconnected");
    assert.equal(client.state, "closed");
    assert.equal(errors.at(-1).code, "disconnected");
    clock.advance(3_600_000);
    assert.equal(Socket.instances.length, 1);
  });
});

test("close 4011 with a connection token given as a string: closed (it cannot be renewed)", async () => {
  const { clock, Socket, client, errors } = setup({ token: fakeJwt({ sub: "ann", exp: 4e9 }) });
  client.connect();
  await flush();
  Socket.last.accept();
  Socket.last.serverClose(4011, "token expired");
  assert.equal(client.state, "closed");
  assert.equal(errors.at(-1).code, "token_expired");
  clock.advance(3_600_000);
  await flush();
  assert.equal(Socket.instances.length, 1, "no reconnect with the expired token");
});

test("close 4011 (token expired): a new connection token, then a reconnect with it", async () => {
  let n = 0;
  const { clock, Socket, client, errors } = setup({
    token: () => fakeJwt({ sub: "ann", exp: 4e9 + (n += 1) }),
  });
  client.connect();
  await flush();
  Socket.last.accept();
  const first = new URL(Socket.last.url).searchParams.get("token");
  Socket.last.serverClose(4011, "token expired");
  assert.equal(client.state, "disconnected");
  assert.equal(errors.at(-1).code, "token_expired");
  clock.advance(3000);
  await flush();
  assert.equal(Socket.instances.length, 2);
  const second = new URL(Socket.last.url).searchParams.get("token");
  assert.notEqual(second, first);
  assert.equal(n, 2);
});

test("connection token failing: an error, and another try after a backoff", async () => {
  let fail = true;
  const { clock, Socket, client, errors } = setup({
    token: async () => {
      if (fail) throw new Error("auth endpoint down");
      return fakeJwt({ sub: "ann", exp: 4e9 });
    },
  });
  client.connect();
  await flush();
  assert.equal(Socket.instances.length, 0);
  assert.equal(errors.at(-1).code, "token_failed");
  assert.equal(client.state, "disconnected");
  fail = false;
  clock.advance(3000);
  await flush();
  assert.equal(Socket.instances.length, 1);
});

test("a refused connection token refresh is the client's error, not a waiting subscribe's", async () => {
  const { clock, Socket, client, errors } = setup({
    heartbeatMarginMs: 1e9,
    token: () => fakeJwt({ sub: "ann", exp: Math.floor(clock.now() / 1000) + 600 }),
  });
  client.connect();
  await flush();
  Socket.last.readyState = 1;
  Socket.last.frame({ type: "connected", connection_id: "1.1", heartbeat_s: 1e6, user_id: "ann" });
  clock.advance(570_000);
  await flush();
  assert.equal(Socket.last.sentOf("refresh").length, 1);
  const sub = client.subscribe("news", () => {});
  Socket.last.frame({ type: "error", code: "forbidden", message: "another user" });
  assert.equal(errors.at(-1).code, "forbidden");
  assert.equal(sub.state, "subscribing", "the subscribe still waits for its own answer");
  Socket.last.frame({ type: "subscribed", channel: "news" });
  assert.equal(sub.state, "subscribed");
});
