// Presence channels and client events end to end: the JavaScript client in Debian's
// Chromium against the real ringcast binary, one page per browser tab. Each page's
// getToken asks the test (page.exposeFunction), which signs an HS256 token with the
// project's token secret for that page's user, as an application backend would.
// Each test starts its own server and project.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  cli, startServer, createProject, publish, apiGet, signToken, ringcastPages,
  waitFor, watchPage, perFile, tcpProxy,
} from "./helpers.mjs";

const pages = perFile(ringcastPages);

const ROOM = "presence-room";

/**
 * A browser tab of `user`: its tokens carry `sub: user` and, when given, `info`.
 * `options` go to new Ringcast().
 */
async function openTab(server, project, user, info, options = {}, wsUrl = server.wsUrl) {
  const page = await pages.browser.newPage();
  const problems = watchPage(page);
  await page.exposeFunction("ringcastToken", (channel) => {
    const claims = { channel, sub: user, exp: Math.floor(Date.now() / 1000) + 600 };
    if (info !== undefined) claims.info = info;
    return signToken(project.tokenSecret, claims);
  });
  await page.goto(`${pages.site.url}/`);
  await page.waitForFunction(() => window.t !== undefined);
  await page.evaluate(([url, k, o]) => window.t.start(url, k, o), [wsUrl, project.public, options]);
  return { page, problems, user };
}

const subscribedCount = (tab, channel = ROOM) =>
  tab.page.evaluate((c) => window.t.count(window.t.subscribed, c), channel);

/** Subscribe the tab to `channel` and wait for its `subscribed` (the `times`-th one). */
async function join(tab, channel = ROOM, times = 1) {
  await tab.page.evaluate((c) => window.t.subscribe(c), channel);
  await waitFor(async () => (await subscribedCount(tab, channel)) >= times, {
    message: `${tab.user} subscribed to ${channel}`,
  });
}

const members = (tab, channel = ROOM) => tab.page.evaluate((c) => window.t.members(c), channel);
const presence = (tab) => tab.page.evaluate(() => window.t.presence);
const errors = (tab) => tab.page.evaluate(() => window.t.errors);
const messages = (tab) => tab.page.evaluate(() => window.t.messages);
const users = (list) => list.map((m) => m.user_id);
const actions = (events) => events.map((e) => [e.action, e.user_id]);

/** Wait until the tab lists exactly `expected` user ids, in this order. */
async function waitMembers(tab, expected, channel = ROOM) {
  await waitFor(async () => JSON.stringify(users(await members(tab, channel))) === JSON.stringify(expected), {
    message: `${tab.user}'s page to list ${expected.join(", ")}`,
  });
}

/** Wait until the tab has seen `n` presence events; returns them. */
async function waitPresence(tab, n) {
  return waitFor(
    async () => {
      const events = await presence(tab);
      return events.length >= n && events;
    },
    { message: `${n} presence event(s) in ${tab.user}'s page` },
  );
}

const channelInfo = async (server, project) =>
  (await apiGet(server, project.secret, `/api/v1/channels/info?channel=${ROOM}`)).body;

test("two users see each other; a second tab is not another member; the last tab to close is the leave", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const alice = await openTab(server, project, "alice", { name: "Alice" });
  await join(alice);
  assert.deepEqual(await members(alice), [{ user_id: "alice", info: { name: "Alice" } }]);

  const bob = await openTab(server, project, "bob", { name: "Bob" });
  await join(bob);
  const both = [
    { user_id: "alice", info: { name: "Alice" } },
    { user_id: "bob", info: { name: "Bob" } },
  ];
  assert.deepEqual(await members(bob), both);
  await waitMembers(alice, ["alice", "bob"]);
  assert.deepEqual(await members(alice), both);
  assert.deepEqual(await presence(alice), [
    { channel: ROOM, action: "join", user_id: "bob", info: { name: "Bob" } },
  ]);
  // Bob's own join is in his list, not an event.
  assert.deepEqual(await presence(bob), []);

  // Alice's second tab, whose token carries other details: still one member, with the
  // info of her first connection.
  const alice2 = await openTab(server, project, "alice", { name: "Alice, tab 2" });
  await join(alice2);
  assert.deepEqual(await members(alice2), both);
  // Carol has no info: she is listed without it.
  const carol = await openTab(server, project, "carol");
  await join(carol);
  await waitMembers(bob, ["alice", "bob", "carol"]);
  assert.deepEqual((await members(bob))[2], { user_id: "carol" });
  // A page gets the server's frames in order: had the second tab been announced, its
  // join would be in front of carol's.
  assert.deepEqual(actions(await presence(bob)), [["join", "carol"]]);
  await waitMembers(alice, ["alice", "bob", "carol"]);
  assert.deepEqual(actions(await presence(alice)), [["join", "bob"], ["join", "carol"]]);
  assert.deepEqual(await members(carol), await members(bob));

  // The server's REST view is the pages' view.
  const rest = await apiGet(server, project.secret, `/api/v1/presence?channel=${ROOM}`);
  assert.equal(rest.status, 200, JSON.stringify(rest.body));
  assert.deepEqual(rest.body, { channel: ROOM, count: 3, members: await members(bob) });
  assert.deepEqual(await channelInfo(server, project), {
    channel: ROOM, occupied: true, subscribers: 4, user_count: 3,
  });

  // Alice closes her first tab: the second keeps her in the channel.
  await alice.page.close();
  await waitFor(async () => (await channelInfo(server, project)).subscribers === 3, {
    message: "the server to drop alice's first tab",
  });
  // Carol closes hers: bob sees carol leave, and nothing about alice.
  await carol.page.close();
  await waitPresence(bob, 2);
  assert.deepEqual(await presence(bob), [
    { channel: ROOM, action: "join", user_id: "carol" },
    { channel: ROOM, action: "leave", user_id: "carol" },
  ]);
  assert.deepEqual(await members(bob), both);
  // Alice's last tab closes: she leaves, once, reported with the info she joined with.
  await alice2.page.close();
  const events = await waitPresence(bob, 3);
  assert.deepEqual(events[2], { channel: ROOM, action: "leave", user_id: "alice", info: { name: "Alice" } });
  assert.deepEqual(await members(bob), [{ user_id: "bob", info: { name: "Bob" } }]);
  assert.deepEqual(await channelInfo(server, project), {
    channel: ROOM, occupied: true, subscribers: 1, user_count: 1,
  });
  assert.deepEqual(await errors(bob), []);
  assert.deepEqual(bob.problems, []);
  await bob.page.close();
});

test("client events: off by default, then from one tab to every other subscriber, never back to the sender", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const alice = await openTab(server, project, "alice", { name: "Alice" });
  const alice2 = await openTab(server, project, "alice", { name: "Alice" });
  const bob = await openTab(server, project, "bob", { name: "Bob" });
  for (const tab of [alice, alice2, bob]) await join(tab);
  const trigger = (tab, event, data) =>
    tab.page.evaluate(([c, e, d]) => window.t.subs[c].trigger(e, d), [ROOM, event, data]);

  // Off by default: the sender's subscription hears `forbidden`, the channel stays held.
  assert.equal(await trigger(alice, "client-typing", { typing: true }), true);
  await waitFor(async () => (await errors(alice)).some((e) => e.code === "forbidden" && e.channel === ROOM), {
    message: "forbidden while client events are off",
  });
  assert.equal(await alice.page.evaluate((c) => window.t.subs[c].state, ROOM), "subscribed");

  await cli(server.dataDir, "project", "set-limits", project.id, "--client-events", "on");
  // The server applies the switch within a second: try (within the 10/s limit) until one
  // gets through.
  let tries = 0;
  await waitFor(
    async () => {
      if ((await messages(bob)).some((m) => m.event === "client-typing")) return true;
      tries += 1;
      await trigger(alice, "client-typing", { try: tries });
      return false;
    },
    { interval: 200, timeout: 5000, message: "a client event to get through" },
  );

  assert.equal(await trigger(alice, "client-typing", { last: true }), true);
  const isLast = (m) => m.event === "client-typing" && m.data.last === true;
  for (const tab of [bob, alice2]) {
    const got = await waitFor(async () => (await messages(tab)).find(isLast), {
      message: `the event in ${tab.user}'s other page`,
    });
    const { id, ...rest } = got;
    assert.deepEqual(rest, { channel: ROOM, event: "client-typing", data: { last: true }, user_id: "alice" });
    assert.equal(typeof id, "string");
  }
  // Bob answers: it reaches both of alice's tabs, marked as bob's.
  assert.equal(await trigger(bob, "client-reply", "hi"), true);
  for (const tab of [alice, alice2]) {
    const got = await waitFor(async () => (await messages(tab)).find((m) => m.event === "client-reply"), {
      message: `bob's event in a page of alice`,
    });
    assert.equal(got.data, "hi");
    assert.equal(got.user_id, "bob");
  }
  // A publish after all of that reaches the sender after anything sent to it before:
  // alice's own events never came back.
  assert.equal((await publish(server, project.secret, ROOM, "after", { n: 1 })).status, 202);
  await waitFor(async () => (await messages(alice)).some((m) => m.event === "after"), { message: "the publish" });
  assert.deepEqual((await messages(alice)).map((m) => m.event), ["client-reply", "after"]);
  assert.ok(!(await messages(bob)).some((m) => m.event === "client-reply"), "bob got his own event back");
  // Only the attempts before the switch was applied were refused, and none was rate limited.
  assert.ok((await errors(alice)).every((e) => e.code === "forbidden"), JSON.stringify(await errors(alice)));
  for (const tab of [alice2, bob]) assert.deepEqual(await errors(tab), []);
  for (const tab of [alice, alice2, bob]) await tab.page.close();
});

test("presence_full reaches the subscription's error handler; the page subscribes again once there is room", async () => {
  const server = await startServer({ config: "max_presence_members = 1\n" });
  const project = await createProject(server);
  const alice = await openTab(server, project, "alice", { name: "Alice" });
  const alice2 = await openTab(server, project, "alice", { name: "Alice" });
  await join(alice);
  // Another tab of the one member is not another member.
  await join(alice2);
  assert.deepEqual(users(await members(alice2)), ["alice"]);

  const bob = await openTab(server, project, "bob", { name: "Bob" });
  await waitFor(() => bob.page.evaluate(() => window.t.client.state === "connected"), { message: "bob connected" });
  await bob.page.evaluate((c) => window.t.subscribe(c), ROOM);
  await waitFor(async () => (await errors(bob)).length > 0, { message: "bob's error" });
  assert.deepEqual((await errors(bob)).map((e) => [e.channel, e.code]), [[ROOM, "presence_full"]]);
  // The refused channel is not held (and not retried); the connection is fine.
  assert.deepEqual(
    await bob.page.evaluate((c) => [window.t.subs[c].state, window.t.client.subscription(c) ?? null, window.t.client.state], ROOM),
    ["unsubscribed", null, "connected"],
  );
  assert.deepEqual(await members(bob), []);
  assert.deepEqual(await presence(alice), []);

  // Alice leaves; bob subscribes again on the same connection and is the member.
  await alice.page.close();
  await alice2.page.close();
  await waitFor(async () => (await channelInfo(server, project)).user_count === 0, { message: "alice gone" });
  await join(bob);
  assert.deepEqual(await members(bob), [{ user_id: "bob", info: { name: "Bob" } }]);
  assert.equal(await bob.page.evaluate(() => window.t.attempts), 1);
  assert.equal((await errors(bob)).length, 1);
  await bob.page.close();
});

test("after a lost connection the member list is the server's again: no one who left while away", async () => {
  const server = await startServer({ config: "heartbeat_s = 1\n" });
  const project = await createProject(server);
  const proxy = await tcpProxy(server.addr);
  const alice = await openTab(server, project, "alice", { name: "Alice" });
  const carol = await openTab(server, project, "carol", { name: "Carol" });
  await join(alice);
  await join(carol);
  const bob = await openTab(
    server,
    project,
    "bob",
    { name: "Bob" },
    { minReconnectDelayMs: 50, maxReconnectDelayMs: 200, heartbeatMarginMs: 500 },
    `ws://127.0.0.1:${proxy.port}/api/v1/ws`,
  );
  await join(bob);
  assert.deepEqual(users(await members(bob)), ["alice", "carol", "bob"]);

  // Bob's network path goes silent; carol leaves meanwhile. Alice hears it, bob cannot.
  proxy.freeze();
  await carol.page.close();
  await waitPresence(alice, 3);
  assert.deepEqual(actions(await presence(alice)), [["join", "carol"], ["join", "bob"], ["leave", "carol"]]);

  // Bob's client finds the connection dead, reconnects and subscribes again: the list is
  // the one the server sent now, without carol, though bob never saw her leave.
  await waitFor(async () => (await subscribedCount(bob)) >= 2, { timeout: 15000, message: "bob subscribed again" });
  assert.equal(proxy.connections, 2);
  assert.deepEqual(users(await members(bob)), ["alice", "bob"]);
  assert.deepEqual(await presence(bob), []);
  for (const tab of [alice, bob]) await tab.page.close();
});
