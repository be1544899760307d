// The console page (clients/console/index.html) in Debian's Chromium.
// 1. Served by ringcast itself at /console (`serve --dev`): the real route. Saves
//    docs/console.png when it passes (if missing, or with UPDATE_SCREENSHOTS=1).
// 2. The same page served by the static test server at /console, pointed at a ringcast
//    server with ?server=: checks the page itself whatever the route's state.

import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { existsSync } from "node:fs";
import {
  repoRoot, tempDir, startServer, createProject, publish, staticServer,
  waitFor, watchPage, perFile, signToken,
} from "./helpers.mjs";

const pages = perFile();

/** Fill the form, connect, and wait until every channel shows "subscribed". */
async function watch(page, key, channels) {
  await page.waitForSelector("body[data-ready=true]");
  await page.fill("#key", key);
  await page.fill("#channels", channels.join(", "));
  await page.click("#connect");
  await page.waitForSelector('#state[data-state="connected"]');
  // Chromium offers permessage-deflate and the server agrees (ws_compression is on).
  assert.equal(await page.getAttribute("#state", "data-compressed"), "true");
  assert.match(await page.textContent("#state"), /compressed/);
  for (const c of channels) {
    await page.waitForSelector(`.chip[data-channel="${c}"][data-state="subscribed"]`);
  }
}

async function rows(page) {
  return page.$$eval("#messages tr.message", (trs) =>
    trs.map((tr) => Object.fromEntries([...tr.cells].map((td) => [td.className, td.textContent]))),
  );
}

async function publishAndSee(page, server, secret) {
  const sent = [
    ["orders", "order.created", { order_id: 1042, total: "39.90", currency: "EUR", items: 3 }],
    ["news", "article.published", { title: "ringcast 0.1 is out", url: "/blog/0-1" }],
    ["orders", "order.shipped", { order_id: 1038, carrier: "DHL", eta: "2026-11-25" }],
  ];
  const ids = [];
  for (const [channel, event, data] of sent) {
    const res = await publish(server, secret, channel, event, data);
    assert.equal(res.status, 202, JSON.stringify(res.body));
    ids.push(res.body.id);
  }
  const shown = await waitFor(async () => {
    const r = await rows(page);
    return r.length === sent.length && r;
  }, { message: "three rows in the console" });
  // Newest first: channel, event, id and the data are all shown.
  const newestFirst = [...sent].reverse();
  const idsNewestFirst = [...ids].reverse();
  shown.forEach((row, i) => {
    const [channel, event, data] = newestFirst[i];
    assert.equal(row.channel, channel);
    assert.equal(row.event, event);
    assert.equal(row.id, idsNewestFirst[i]);
    assert.deepEqual(JSON.parse(row.data), data);
    assert.match(row.time, /^\d{1,2}:\d{2}:\d{2}$/);
  });
}

test("GET /console on `serve --dev` shows a published message (saves docs/console.png)", async () => {
  const dataDir = await tempDir("ringcast-console-");
  const server = await startServer({ dataDir, dev: true });
  assert.ok(server.devKeys, "serve --dev printed the dev project's keys");
  const { public_key: pk, secret_key: sk } = server.devKeys;

  const page_ = await fetch(`${server.url}/console`);
  const html = await page_.text();
  assert.equal(page_.status, 200, `GET /console answered ${page_.status}: the /console route is not wired in the server yet`);
  assert.match(page_.headers.get("content-type") || "", /text\/html/);
  assert.match(html, /ringcast console/);
  const js = await fetch(`${server.url}/console/ringcast.js`);
  assert.equal(js.status, 200, "GET /console/ringcast.js");
  assert.match(js.headers.get("content-type") || "", /javascript/);
  await js.text();

  const page = await pages.browser.newPage();
  const problems = watchPage(page);
  await page.goto(`${server.url}/console`);
  await watch(page, pk, ["orders", "news"]);
  await publishAndSee(page, server, sk);
  // The curl line names this server and a placeholder secret key, never a real one.
  const curl = await page.textContent("#curl");
  assert.ok(curl.includes(`${server.url}/api/v1/publish`), curl);
  assert.ok(curl.includes("sk_..."), curl);
  assert.ok(!curl.includes(sk));
  assert.deepEqual(problems, []);
  // docs/console.png is written when missing or with UPDATE_SCREENSHOTS=1, so that a
  // test run does not leave a changed file in the work tree every time.
  const shot = path.join(repoRoot, "docs/console.png");
  const update = process.env.UPDATE_SCREENSHOTS === "1" || !existsSync(shot);
  await page.screenshot({ path: update ? shot : path.join(await tempDir(), "console.png"), fullPage: true });
  await page.close();
});

/** A fresh server and project, and the console page served statically (the files as
 * they are in the repository), pointed at that server with ?server=. */
async function staticConsole() {
  const server = await startServer();
  const project = await createProject(server);
  const site = await staticServer({
    "/console": path.join(repoRoot, "clients/console/index.html"),
    "/console/ringcast.js": path.join(repoRoot, "clients/js/ringcast.js"),
  });
  const page = await pages.browser.newPage();
  const problems = watchPage(page);
  await page.goto(`${site.url}/console?server=${encodeURIComponent(server.url)}`);
  return { server, project, page, problems };
}

test("the console page (served statically, ?server=) connects, lists messages, refuses a secret key", async () => {
  const { server, project, page, problems } = await staticConsole();

  // A secret key is refused before anything is sent.
  await page.waitForSelector("body[data-ready=true]");
  await page.fill("#key", project.secret);
  await page.fill("#channels", "orders");
  await page.click("#connect");
  await waitFor(async () => /secret key/.test(await page.textContent("#notice")), { message: "secret key notice" });
  assert.equal(await page.getAttribute("#state", "data-state"), "idle");

  await watch(page, project.public, ["orders", "news"]);
  await publishAndSee(page, server, project.secret);
  const curl = await page.textContent("#curl");
  assert.ok(curl.includes(`${server.url}/api/v1/publish`), curl);
  assert.ok(curl.includes("X-Api-Key: sk_..."), curl);

  // Clear empties the list; Disconnect closes.
  await page.click("#clear");
  assert.equal((await rows(page)).length, 0);
  await page.click("#disconnect");
  await page.waitForSelector('#state[data-state="closed"]');
  assert.deepEqual(problems, []);
  await page.close();
});

test("the console connects with a connection token, shows its user, and says so when the user is disconnected", async () => {
  const { server, project, page, problems } = await staticConsole();
  await page.waitForSelector("body[data-ready=true]");
  const exp = Math.floor(Date.now() / 1000) + 600;
  await page.click("details summary"); // "Server and user" is folded by default
  await page.fill("#token", signToken(project.tokenSecret, { sub: "ann", exp }));
  await watch(page, project.public, ["orders"]);
  assert.equal(await page.getAttribute("#state", "data-user"), "ann");
  assert.match(await page.textContent("#state"), /user ann/);

  // The backend ends the user's access: the console closes and says why.
  const res = await fetch(`${server.url}/api/v1/users/ann/disconnect`, {
    method: "POST",
    headers: { "X-Api-Key": project.secret },
  });
  assert.equal(res.status, 202);
  await page.waitForSelector('#state[data-state="closed"]');
  await waitFor(async () => /4010/.test(await page.textContent("#notice")), { message: "4010 notice" });
  assert.deepEqual(problems, []);
  await page.close();
});
