// The JavaScript client in Debian's Chromium against the real ringcast binary.
// Each test starts its own server (127.0.0.1:0, own data directory) and project; the page
// is served by a tiny static server; publishes use Node's fetch.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  cli, startServer, createProject, publish, ringcastPages,
  waitFor, watchPage, perFile, tcpProxy,
} from "./helpers.mjs";

const pages = perFile(ringcastPages);

/** A fresh page with the client module loaded; `options` go to new Ringcast(). */
async function openPage(server, key, options = {}, wsUrl = server.wsUrl) {
  const page = await pages.browser.newPage();
  const problems = watchPage(page);
  await page.goto(`${pages.site.url}/`);
  await page.waitForFunction(() => window.t !== undefined);
  await page.evaluate(([url, k, o]) => window.t.start(url, k, o), [wsUrl, key, options]);
  return { page, problems };
}

const read = (page, expr) => page.evaluate(expr);

async function waitSubscribed(page, channel, times = 1) {
  await waitFor(
    () => page.evaluate(([c, n]) => window.t.count(window.t.subscribed, c) >= n, [channel, times]),
    { message: `"${channel}" subscribed ${times}x` },
  );
}

async function waitMessages(page, n) {
  return waitFor(
    async () => {
      const msgs = await read(page, () => window.t.messages);
      return msgs.length >= n && msgs;
    },
    { message: `${n} message(s) in the page` },
  );
}

test("subscribe and receive a published message", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const { page, problems } = await openPage(server, project.public);
  await waitFor(() => read(page, () => window.t.client.state === "connected"), { message: "connected" });
  await page.evaluate(() => window.t.subscribe("news"));
  await waitSubscribed(page, "news");

  const data = { id: 42, text: "héllo", nested: { list: [1, 2.5, null, true] } };
  const res = await publish(server, project.secret, "news", "order.created", data);
  assert.equal(res.status, 202, JSON.stringify(res.body));

  const [msg] = await waitMessages(page, 1);
  assert.deepEqual(msg, { channel: "news", event: "order.created", data, id: res.body.id });
  assert.deepEqual(await read(page, () => window.t.states), ["connecting", "connected"]);
  assert.deepEqual(problems, []);
  await page.close();
});

test("many channels on one connection: each message reaches its channel once", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const { page } = await openPage(server, project.public);
  const channels = Array.from({ length: 40 }, (_, i) => `room-${i}`);
  await page.evaluate((cs) => cs.forEach((c) => window.t.subscribe(c)), channels);
  await waitFor(
    () => read(page, () => new Set(window.t.subscribed).size === 40),
    { message: "40 channels subscribed" },
  );
  const ids = {};
  for (const c of channels) {
    const res = await publish(server, project.secret, c, "tick", { c });
    assert.equal(res.status, 202);
    ids[c] = res.body.id;
  }
  // A string payload goes through as a string.
  const str = await publish(server, project.secret, "room-0", "text", "plain string");
  await waitMessages(page, 41);
  // A last publish on one connection arrives after everything before it: any duplicate
  // would be in the page by then.
  await publish(server, project.secret, "room-39", "last", {});
  await waitFor(() => read(page, () => window.t.messages.some((m) => m.event === "last")), { message: "last" });
  const msgs = await read(page, () => window.t.messages);
  assert.equal(msgs.length, 42);
  for (const c of channels) {
    const got = msgs.filter((m) => m.channel === c && m.event === "tick");
    assert.equal(got.length, 1, c);
    assert.deepEqual(got[0].data, { c });
    assert.equal(got[0].id, ids[c]);
  }
  const text = msgs.find((m) => m.event === "text");
  assert.equal(text.data, "plain string");
  assert.equal(text.id, str.body.id);
  await page.close();
});

test("unsubscribe: no more messages on that channel, others go on", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const { page } = await openPage(server, project.public);
  await page.evaluate(() => {
    window.t.subscribe("a");
    window.t.subscribe("b");
  });
  await waitSubscribed(page, "a");
  await waitSubscribed(page, "b");
  assert.equal((await publish(server, project.secret, "a", "e", { n: 1 })).status, 202);
  await waitMessages(page, 1);

  await page.evaluate(() => window.t.unsubscribe("a"));
  // The server has applied the unsubscribe once it answers a frame sent after it: a
  // subscribe to "c" travels behind the unsubscribe on the same socket.
  await page.evaluate(() => window.t.subscribe("c"));
  await waitSubscribed(page, "c");
  assert.equal((await publish(server, project.secret, "a", "e", { n: 2 })).status, 202);
  assert.equal((await publish(server, project.secret, "b", "e", { n: 3 })).status, 202);
  // Publishes are delivered in order on one connection: when b's arrives, a's would have.
  const msgs = await waitMessages(page, 2);
  assert.deepEqual(msgs.map((m) => [m.channel, m.data.n]), [["a", 1], ["b", 3]]);
  await page.close();
});

test("server restarted on the same port and data dir: the page reconnects and resubscribes", async () => {
  const first = await startServer();
  const project = await createProject(first);
  const { page } = await openPage(first, project.public, {
    minReconnectDelayMs: 100,
    maxReconnectDelayMs: 1000,
  });
  await page.evaluate(() => {
    window.t.subscribe("news");
    window.t.subscribe("sport");
  });
  await waitSubscribed(page, "news");
  await waitSubscribed(page, "sport");
  assert.equal((await publish(first, project.secret, "news", "before", {})).status, 202);
  await waitMessages(page, 1);

  await first.stop(); // SIGTERM: sockets closed with 1001
  await waitFor(() => read(page, () => window.t.client.state === "disconnected"), { message: "disconnected" });
  const second = await startServer({ dataDir: first.dataDir, listen: `127.0.0.1:${first.port}` });
  assert.equal(second.port, first.port);

  await waitSubscribed(page, "news", 2);
  await waitSubscribed(page, "sport", 2);
  const res = await publish(second, project.secret, "sport", "after", { goal: 1 });
  assert.equal(res.status, 202);
  const msgs = await waitMessages(page, 2);
  assert.deepEqual(msgs[1], { channel: "sport", event: "after", data: { goal: 1 }, id: res.body.id });
  const states = await read(page, () => window.t.states);
  assert.deepEqual(states.slice(0, 3), ["connecting", "connected", "disconnected"]);
  assert.equal(states.at(-1), "connected");
  const errors = await read(page, () => window.t.errors);
  assert.ok(errors.some((e) => e.closeCode === 1001), JSON.stringify(errors));
  await page.close();
});

test("key revoked while connected: state closed, no reconnect storm", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const minDelay = 50;
  const maxDelay = 200;
  const { page } = await openPage(server, project.public, {
    minReconnectDelayMs: minDelay,
    maxReconnectDelayMs: maxDelay,
  });
  await page.evaluate(() => window.t.subscribe("news"));
  await waitSubscribed(page, "news");
  assert.equal(await read(page, () => window.t.attempts), 1);

  const revoked = await cli(server.dataDir, "key", "revoke", project.public);
  assert.ok(revoked.revoked, JSON.stringify(revoked));
  await waitFor(() => read(page, () => window.t.client.state === "closed"), { message: "state closed" });
  const errors = await read(page, () => window.t.errors);
  assert.ok(errors.some((e) => e.code === "key_revoked" && e.closeCode === 4001), JSON.stringify(errors));

  // Watch for ten times the longest reconnect delay: a client that reconnected would have
  // opened several sockets by then.
  await page.evaluate(() => { window.t.closedAt = performance.now(); });
  await waitFor(
    () => page.evaluate((ms) => performance.now() - window.t.closedAt > ms, maxDelay * 10),
    { message: "the observation window" },
  );
  assert.equal(await read(page, () => window.t.attempts), 1);
  assert.deepEqual(await read(page, () => window.t.states), ["connecting", "connected", "closed"]);
  await page.close();
});

test("a publish before connect and after close is not received; connect() again resumes", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const { page } = await openPage(server, project.public);
  await page.evaluate(() => window.t.subscribe("news"));
  await waitSubscribed(page, "news");
  await page.evaluate(() => window.t.client.close());
  assert.equal(await read(page, () => window.t.client.state), "closed");
  assert.equal((await publish(server, project.secret, "news", "missed", {})).status, 202);
  await page.evaluate(() => window.t.client.connect());
  await waitSubscribed(page, "news", 2);
  const res = await publish(server, project.secret, "news", "seen", {});
  const msgs = await waitMessages(page, 1);
  assert.deepEqual(msgs.map((m) => m.event), ["seen"]);
  assert.equal(msgs[0].id, res.body.id);
  assert.equal(await read(page, () => window.t.attempts), 2);
  await page.close();
});

test("dead connection (the network path goes silent): detected by heartbeat, reconnect, resubscribe", async () => {
  const server = await startServer({ config: "heartbeat_s = 1\n" });
  const project = await createProject(server);
  const proxy = await tcpProxy(server.addr);
  const { page } = await openPage(
    server,
    project.public,
    { minReconnectDelayMs: 50, maxReconnectDelayMs: 200, heartbeatMarginMs: 500 },
    `ws://127.0.0.1:${proxy.port}/api/v1/ws`,
  );
  await page.evaluate(() => window.t.subscribe("news"));
  await waitSubscribed(page, "news");
  assert.equal(proxy.connections, 1);

  proxy.freeze(); // no close frame, no FIN: only the heartbeat can tell
  const frozenAt = Date.now();
  await waitFor(() => read(page, () => window.t.errors.some((e) => e.code === "heartbeat_timeout")), {
    timeout: 15000,
    message: "heartbeat_timeout",
  });
  const detectedAfter = Date.now() - frozenAt;
  // 3 x heartbeat_s + margin = 3.5 s after the last frame, which came at most 1 s before the freeze.
  assert.ok(detectedAfter >= 2000 && detectedAfter < 8000, `detected after ${detectedAfter} ms`);
  await waitSubscribed(page, "news", 2);
  assert.equal(proxy.connections, 2);
  const res = await publish(server, project.secret, "news", "after", { ok: true });
  const [msg] = await waitMessages(page, 1);
  assert.equal(msg.id, res.body.id);
  const states = await read(page, () => window.t.states);
  assert.deepEqual(states, ["connecting", "connected", "disconnected", "connecting", "connected"]);
  await page.close();
});
