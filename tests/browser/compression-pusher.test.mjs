// pusher-js's browser build in Chromium with permessage-deflate (issue 23): the page's
// WebSocket agrees to the extension on /app/{key}, a 4 KB published event arrives intact
// (the Pusher frame, compressed once per message), and a 2 KB client event that
// Chromium sends compressed reaches the other page. Same page and setup as
// pusher-browser.test.mjs; each page's WebSocket objects are recorded by an init script
// so the test can read `extensions`.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { repoRoot, startServer, cli, staticServer, launchBrowser, waitFor, cleanupAll } from "./helpers.mjs";
import { pusherProject, clientOptions, authServer, nativePublish } from "./pusher-helpers.mjs";

let server;
let project;
let auth;
let site;
let browser;

before(async () => {
  server = await startServer();
  project = await pusherProject(server);
  await cli(server.dataDir, "project", "set-limits", project.id, "--client-events", "on");
  auth = await authServer(server, project);
  site = await staticServer({
    "/": path.join(repoRoot, "tests/browser/page/pusher.html"),
    "/pusher.min.js": path.join(repoRoot, "tests/browser/node_modules/pusher-js/dist/web/pusher.min.js"),
  });
  browser = await launchBrowser();
});

after(cleanupAll);

async function openPage(user) {
  const page = await browser.newPage();
  await page.addInitScript(() => {
    const Native = window.WebSocket;
    window.sockets_ = [];
    window.WebSocket = class extends Native {
      constructor(...args) {
        super(...args);
        window.sockets_.push(this);
      }
    };
  });
  await page.goto(`${site.url}/`);
  const options = clientOptions(server, `${auth.url}/pusher/auth?user=${encodeURIComponent(user)}`);
  await page.evaluate(([key, o]) => window.t.start(key, o), [project.public, options]);
  await waitFor(() => page.evaluate(() => window.t.state() === "connected"), { timeout: 5000, message: "connected" });
  return page;
}

async function subscribe(page, name) {
  await page.evaluate((n) => window.t.subscribe(n), name);
  const s = await waitFor(async () => {
    const s = await page.evaluate((n) => window.t.sub(n), name);
    return (s.succeeded > 0 || s.errors.length > 0) && s;
  }, { timeout: 5000, message: `${name} answered` });
  assert.deepEqual(s.errors, []);
}

const events = (page, name) => page.evaluate((n) => window.t.sub(n).events, name);

function payload(n) {
  const items = [];
  for (let i = 0; JSON.stringify(items).length < n; i++) items.push({ id: i, name: `row ${i}`, price: i * 7 + 0.5 });
  return { items };
}

test("pusher-js in Chromium: compressed both ways", async () => {
  const a = await openPage("a");
  const b = await openPage("b");
  for (const page of [a, b]) {
    const ext = await page.evaluate(() => window.sockets_.map((s) => s.extensions));
    assert.deepEqual(ext, ["permessage-deflate; server_no_context_takeover; client_no_context_takeover"]);
  }
  const CHAT = "private-deflate";
  for (const page of [a, b]) await subscribe(page, CHAT);
  const big = payload(4096);
  assert.equal((await nativePublish(server, project, CHAT, "big", big)).status, 202);
  for (const page of [a, b]) {
    const got = await waitFor(async () => (await events(page, CHAT)).find((e) => e.event === "big"), { message: "the 4 KB event" });
    assert.deepEqual(got.data, big);
  }
  // A client event (Pusher limits them to 10 KB): sent compressed by Chromium. The
  // client-events switch may take a moment to apply: try until it gets through.
  const small = payload(2048);
  await waitFor(async () => {
    if ((await events(b, CHAT)).some((e) => e.event === "client-big")) return true;
    await a.evaluate(([c, d]) => window.t.trigger(c, "client-big", d), [CHAT, small]);
    return false;
  }, { interval: 250, timeout: 5000, message: "the client event" });
  const got = (await events(b, CHAT)).find((e) => e.event === "client-big");
  assert.deepEqual(got.data, small);
});
