// The JavaScript client's connection token in Debian's Chromium against the real ringcast
// binary (issue 25): the page's token function asks the test (page.exposeFunction), which
// signs as the application's backend would. 4011 at exp + 5 s: a fresh token and a
// reconnect; 4010 (the REST disconnect): state closed, no reconnect.

import { test } from "node:test";
import assert from "node:assert/strict";
import { startServer, createProject, signToken, ringcastPages, waitFor, watchPage, perFile } from "./helpers.mjs";

const pages = perFile(ringcastPages);
const read = (page, expr) => page.evaluate(expr);

test("Chromium: 4011 brings a fresh connection token and a reconnect; 4010 ends in closed", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const page = await pages.browser.newPage();
  const problems = watchPage(page);
  const issued = [];
  let firstExp = 0;
  // Until the first token (2 s) has expired it is given again: its refresh would not
  // extend it, so none is sent and the server closes at exp + 5 s.
  await page.exposeFunction("ringcastConnectionToken", () => {
    const now = Math.floor(Date.now() / 1000);
    if (issued.length > 0 && now <= firstExp) return issued[0];
    const exp = now + (issued.length === 0 ? 2 : 600);
    if (issued.length === 0) firstExp = exp;
    issued.push(signToken(project.tokenSecret, { sub: "ann", exp }));
    return issued.at(-1);
  });
  await page.goto(`${pages.site.url}/`);
  await page.waitForFunction(() => window.t !== undefined);
  const options = { minReconnectDelayMs: 50, maxReconnectDelayMs: 200 };
  await page.evaluate(([url, k, o]) => window.t.start(url, k, o), [server.wsUrl, project.public, options]);
  await waitFor(() => read(page, () => window.t.client.state === "connected"), { message: "connected" });
  assert.equal(await read(page, () => window.t.client.userId), "ann");

  await waitFor(
    async () => (await read(page, () => window.t.errors)).some((e) => e.closeCode === 4011),
    { timeout: 15000, message: "4011" },
  );
  await waitFor(
    () => read(page, () => window.t.client.state === "connected" && window.t.attempts >= 2),
    { timeout: 5000, message: "connected again" },
  );
  assert.ok(issued.length >= 2, "a fresh token for the reconnect");
  const attempts = await read(page, () => window.t.attempts);

  const res = await fetch(`${server.url}/api/v1/users/ann/disconnect`, {
    method: "POST",
    headers: { "X-Api-Key": project.secret },
  });
  assert.equal(res.status, 202);
  await waitFor(() => read(page, () => window.t.client.state === "closed"), { message: "closed after 4010" });
  const errors = await read(page, () => window.t.errors);
  assert.ok(errors.some((e) => e.code === "disconnected" && e.closeCode === 4010), JSON.stringify(errors));
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(await read(page, () => window.t.attempts), attempts, "no reconnect after 4010");
  assert.deepEqual(problems, []);
  await page.close();
});
