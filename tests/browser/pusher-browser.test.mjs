// pusher-js's browser build (node_modules/pusher-js/dist/web/pusher.min.js, loaded by a
// script tag from the test's static server) in Debian's Chromium against the real
// ringcast binary (docs/design/pusher.md section 6.2): connect, a native publish, a
// private channel authorised by XHR from the page to the test's auth endpoint (another
// origin: CORS), and a client event from one page to another. One server for the file.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { signToken, waitFor, watchPage, cleanupAll } from "./helpers.mjs";
import { pusherPages, clientOptions, nativePublish, nativeClient, SOCKET_ID } from "./pusher-helpers.mjs";

let server, project, auth, site, browser;

before(async () => {
  ({ server, project, auth, site, browser } = await pusherPages("pusher.html"));
});

after(cleanupAll);

/** A page running pusher-js, connected (within 5 s). */
async function openPage(user = "page") {
  const page = await browser.newPage();
  const problems = watchPage(page);
  await page.goto(`${site.url}/`);
  assert.equal(await page.textContent("#status"), "ready");
  const options = clientOptions(server, `${auth.url}/pusher/auth?user=${encodeURIComponent(user)}`);
  await page.evaluate(([key, o]) => window.t.start(key, o), [project.public, options]);
  await waitFor(() => page.evaluate(() => window.t.state() === "connected"), {
    timeout: 5000,
    message: "pusher-js connected in the page",
  });
  return { page, problems };
}

const sub = (tab, name) => tab.page.evaluate((n) => window.t.sub(n), name);

async function subscribe(tab, name) {
  await tab.page.evaluate((n) => window.t.subscribe(n), name);
  return waitFor(
    async () => {
      const s = await sub(tab, name);
      return (s.succeeded > 0 || s.errors.length > 0) && s;
    },
    { timeout: 5000, message: `${name} answered in the page` },
  );
}

async function waitEvents(tab, name, n) {
  return waitFor(
    async () => {
      const s = await sub(tab, name);
      return s.events.length >= n && s.events;
    },
    { message: `${n} event(s) on ${name} in the page` },
  );
}

test("the browser build connects, and a native publish arrives as its object and as its string", async () => {
  const tab = await openPage();
  assert.match(await tab.page.evaluate(() => window.t.socketId()), SOCKET_ID);
  const s = await subscribe(tab, "orders");
  assert.deepEqual(s.errors, []);
  assert.equal((await nativePublish(server, project, "orders", "order.created", { id: 42 })).status, 202);
  assert.equal((await nativePublish(server, project, "orders", "note", "hello")).status, 202);
  assert.deepEqual(await waitEvents(tab, "orders", 2), [
    { event: "order.created", data: { id: 42 } },
    { event: "note", data: "hello" },
  ]);
  assert.deepEqual(await tab.page.evaluate(() => window.t.errors), []);
  assert.deepEqual(tab.problems, []);
  await tab.page.close();
});

test("a private channel authorised by the page's XHR to the auth endpoint (CORS)", async () => {
  const tab = await openPage();
  const socketId = await tab.page.evaluate(() => window.t.socketId());
  const s = await subscribe(tab, "private-orders");
  assert.deepEqual(s.errors, []);
  assert.equal(s.succeeded, 1);
  assert.ok(
    auth.requests.some((r) => r.channel_name === "private-orders" && r.socket_id === socketId),
    JSON.stringify(auth.requests),
  );
  assert.equal((await nativePublish(server, project, "private-orders", "secret", { n: 1 })).status, 202);
  assert.deepEqual(await waitEvents(tab, "private-orders", 1), [{ event: "secret", data: { n: 1 } }]);
  assert.deepEqual(tab.problems, []);
  await tab.page.close();
});

test("a client event from one page reaches the other page and a native client, not the sender", async () => {
  const CHAT = "private-browser-chat";
  const a = await openPage("a");
  const b = await openPage("b");
  for (const tab of [a, b]) assert.deepEqual((await subscribe(tab, CHAT)).errors, []);
  const native = await nativeClient(server, project.public);
  await native.subscribe(CHAT, signToken(project.tokenSecret, { channel: CHAT, exp: Math.floor(Date.now() / 1000) + 600 }));

  // The switch went on in before(); try (5 a second, under the 10/s limit) until it is applied.
  let tries = 0;
  await waitFor(
    async () => {
      if ((await sub(b, CHAT)).events.length > 0) return true;
      tries += 1;
      await a.page.evaluate(([c, n]) => window.t.trigger(c, "client-typing", { on: true, try: n }), [CHAT, tries]);
      return false;
    },
    { interval: 200, timeout: 5000, message: "a client event to get through" },
  );
  const [got] = (await sub(b, CHAT)).events;
  assert.equal(got.event, "client-typing");
  assert.equal(got.data.on, true);
  await waitFor(() => native.messages(CHAT).length > 0, { message: "the client event in the native client" });
  assert.equal(native.messages(CHAT)[0].event, "client-typing");
  // A publish after it reaches the sender after anything sent to it before: its own
  // events never came back.
  assert.equal((await nativePublish(server, project, CHAT, "after", {})).status, 202);
  assert.deepEqual(await waitEvents(a, CHAT, 1), [{ event: "after", data: {} }]);
  for (const tab of [a, b]) {
    assert.deepEqual(tab.problems, []);
    await tab.page.close();
  }
});
