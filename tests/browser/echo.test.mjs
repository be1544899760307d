// Laravel Echo (laravel-echo's IIFE build, pinned in package.json) over pusher-js's
// browser build in Debian's Chromium, against the real ringcast binary
// (docs/design/pusher.md section 6.3): a page loads pusher.min.js then echo.iife.js as
// a Laravel app does and builds `new Echo({broadcaster: "pusher", ...})` with the
// project's public key and an authEndpoint served by the test (the npm `pusher` SDK's
// authorizeChannel, as Laravel's /broadcasting/auth would). One server for the file.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { waitFor, watchPage, cleanupAll } from "./helpers.mjs";
import { pusherPages, clientOptions, nativePublish, SOCKET_ID } from "./pusher-helpers.mjs";

let server, project, auth, site, browser;

before(async () => {
  ({ server, project, auth, site, browser } = await pusherPages("echo.html", {
    "/echo.iife.js": "laravel-echo/dist/echo.iife.js",
  }));
});

after(cleanupAll);

/** A page with Echo connected (within 5 s) as `user` (its presence member). */
async function openPage(user) {
  const page = await browser.newPage();
  const problems = watchPage(page);
  await page.goto(`${site.url}/`);
  // The IIFE defines window.Echo as the module object, the class as its `default`.
  assert.deepEqual(
    await page.evaluate(() => [typeof window.Pusher, typeof window.Echo, typeof window.Echo?.default]),
    ["function", "object", "function"],
  );
  assert.equal(await page.textContent("#status"), "ready");
  const options = {
    ...clientOptions(server),
    key: project.public,
    authEndpoint: `${auth.url}/broadcasting/auth?user=${encodeURIComponent(user)}`,
  };
  await page.evaluate((o) => window.t.start(o), options);
  await waitFor(() => page.evaluate(() => window.t.state() === "connected"), {
    timeout: 5000,
    message: `Echo connected in ${user}'s page`,
  });
  return { page, problems, user };
}

const entries = (tab, kind) => tab.page.evaluate((k) => window.t.entries(k), kind);

async function waitEntries(tab, kind, n) {
  return waitFor(
    async () => {
      const list = await entries(tab, kind);
      return list.length >= n && list;
    },
    { message: `${n} ${kind} entr(y/ies) in ${tab.user}'s page` },
  );
}

async function waitSubscribed(tab, name) {
  await waitFor(() => tab.page.evaluate((n) => window.t.subscribed(n), name), {
    timeout: 5000,
    message: `${name} subscribed in ${tab.user}'s page`,
  });
}

test("Echo.channel().listen('.order.shipped') gets a native publish; Echo.socketId() as socket_id leaves that page out", async () => {
  const a = await openPage("a");
  const b = await openPage("b");
  const socketId = await a.page.evaluate(() => window.t.socketId());
  assert.match(socketId, SOCKET_ID);
  for (const tab of [a, b]) {
    await tab.page.evaluate(() => window.t.listen("orders", ".order.shipped"));
    await waitSubscribed(tab, "orders");
  }
  assert.equal((await nativePublish(server, project, "orders", "order.shipped", { id: 7 })).status, 202);
  for (const tab of [a, b]) {
    assert.deepEqual(await waitEntries(tab, "listen", 1), [
      { kind: "listen", channel: "orders", event: ".order.shipped", data: { id: 7 } },
    ]);
  }
  // Laravel's toOthers(): the X-Socket-ID of the page that caused the event.
  const res = await nativePublish(server, project, "orders", "order.shipped", { id: 8 }, { socket_id: socketId });
  assert.equal(res.status, 202);
  assert.equal((await nativePublish(server, project, "orders", "order.shipped", { id: 9 })).status, 202);
  await waitEntries(a, "listen", 2);
  await waitEntries(b, "listen", 3);
  assert.deepEqual((await entries(a, "listen")).map((e) => e.data.id), [7, 9]);
  assert.deepEqual((await entries(b, "listen")).map((e) => e.data.id), [7, 8, 9]);
  for (const tab of [a, b]) {
    assert.deepEqual(tab.problems, []);
    await tab.page.close();
  }
});

test("Echo.private('chat'): whisper on one page, listenForWhisper on the other", async () => {
  const a = await openPage("a");
  const b = await openPage("b");
  for (const tab of [a, b]) {
    await tab.page.evaluate(() => window.t.privateChannel("chat"));
    await waitSubscribed(tab, "private-chat");
  }
  assert.ok(auth.requests.some((r) => r.channel_name === "private-chat"), JSON.stringify(auth.requests));
  // The client-events switch went on in before(); whisper (5 a second, under the 10/s
  // limit) until the server applied it.
  let tries = 0;
  await waitFor(
    async () => {
      if ((await entries(b, "whisper")).length > 0) return true;
      tries += 1;
      await a.page.evaluate((n) => window.t.whisper("chat", { typing: true, try: n }), tries);
      return false;
    },
    { interval: 200, timeout: 5000, message: "a whisper to get through" },
  );
  const [got] = await entries(b, "whisper");
  assert.equal(got.channel, "chat");
  assert.equal(got.data.typing, true);
  // And back; the sender never hears its own whisper.
  await b.page.evaluate(() => window.t.whisper("chat", { typing: false }));
  const back = await waitEntries(a, "whisper", 1);
  assert.deepEqual(back.map((e) => e.data), [{ typing: false }]);
  assert.equal((await entries(b, "whisper")).filter((e) => e.data.typing === false).length, 0);
  for (const tab of [a, b]) {
    assert.deepEqual(await entries(tab, "error"), []);
    assert.deepEqual(tab.problems, []);
    await tab.page.close();
  }
});

test("Echo.join('room'): here, joining and leaving across two pages", async () => {
  const alice = await openPage("alice");
  await alice.page.evaluate(() => window.t.join("room"));
  const [here] = await waitEntries(alice, "here", 1);
  assert.deepEqual(here.users, [{ id: "alice", name: "User alice" }]);

  const bob = await openPage("bob");
  await bob.page.evaluate(() => window.t.join("room"));
  const [bobHere] = await waitEntries(bob, "here", 1);
  assert.deepEqual(
    bobHere.users.map((u) => u.id).sort(),
    ["alice", "bob"],
  );
  const [joining] = await waitEntries(alice, "joining", 1);
  assert.deepEqual(joining.user, { id: "bob", name: "User bob" });

  await bob.page.close();
  const [leaving] = await waitEntries(alice, "leaving", 1);
  assert.deepEqual(leaving.user, { id: "bob", name: "User bob" });
  assert.equal((await entries(alice, "joining")).length, 1);
  assert.deepEqual(await entries(alice, "error"), []);
  assert.deepEqual(alice.problems, []);
  await alice.page.close();
});
