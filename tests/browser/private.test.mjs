// Private channels end to end: the JavaScript client's getToken(channel) fetches tokens
// from the example backend (examples/token_endpoint.py, PyJWT) for the real server; the
// client refreshes before expiry, and a refused token reaches the subscription's error
// handler once, without a retry loop.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import WebSocket from "ws";
import { Ringcast } from "../../clients/js/ringcast.js";
import { repoRoot, startServer, cli, publish, waitKey, waitFor, cleanupAll, onCleanup } from "./helpers.mjs";

after(cleanupAll);

const PYTHON = process.env.PYTHON || "python3";

async function privateProject(server) {
  const out = await cli(server.dataDir, "project", "create", "e2e", "--rate-limit", "1000/s");
  const project = { id: out.project.id, secret: out.secret_key, public: out.public_key, tokenSecret: out.token_secret };
  await waitKey(server, project.secret);
  return project;
}

/** Start the example backend; resolves to its base URL. */
async function tokenEndpoint(tokenSecret, ttl) {
  const child = spawn(PYTHON, [path.join(repoRoot, "examples/token_endpoint.py"), "0"], {
    env: { ...process.env, RINGCAST_TOKEN_SECRET: tokenSecret, TOKEN_TTL_S: String(ttl) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  onCleanup(() => child.kill());
  const line = await new Promise((resolve, reject) => {
    readline.createInterface({ input: child.stdout }).once("line", resolve);
    child.once("exit", (code) => reject(new Error(`token endpoint exited ${code}`)));
  });
  return line.replace("listening on ", "").trim();
}

test("getToken from the example backend: subscribe, receive, refresh before expiry", async () => {
  const server = await startServer();
  const project = await privateProject(server);
  // 3 s tokens: without a refresh the subscription would end at exp + 5 s.
  const base = await tokenEndpoint(project.tokenSecret, 3);
  const asked = [];
  const client = new Ringcast(server.wsUrl, {
    key: project.public,
    WebSocket,
    getToken: async (channel) => {
      asked.push(channel);
      const res = await fetch(`${base}/ringcast/token?channel=${encodeURIComponent(channel)}`, {
        headers: { Cookie: "session=42" },
      });
      return (await res.json()).token;
    },
  });
  onCleanup(() => client.close());
  const messages = [];
  const ended = [];
  const errors = [];
  let subscribed = 0;
  const sub = client.subscribe("private-user-42", (m) => messages.push(m));
  sub.on("subscribed", () => (subscribed += 1));
  sub.on("unsubscribed", (reason) => ended.push(reason));
  sub.on("error", (e) => errors.push(e));
  client.connect();
  await waitFor(() => subscribed === 1, { message: "subscribed with a token" });
  const started = Date.now();
  assert.equal((await publish(server, project.secret, "private-user-42", "e", { n: 1 })).status, 202);
  await waitFor(() => messages.length === 1, { message: "the first message" });
  // Past the first token's exp + 5 s: the client refreshed in time, messages continue.
  await waitFor(() => Date.now() - started > 9000 && asked.length >= 2, { timeout: 15000, message: "a refresh and 9 s" });
  assert.equal((await publish(server, project.secret, "private-user-42", "e", { n: 2 })).status, 202);
  await waitFor(() => messages.length === 2, { message: "a message after the first token expired" });
  assert.deepEqual(ended, []);
  assert.deepEqual(errors, []);
  assert.equal(subscribed, 1);
});

test("a forbidden token reaches the subscription's error handler once, without a retry loop", async () => {
  const server = await startServer();
  const project = await privateProject(server);
  let calls = 0;
  const client = new Ringcast(server.wsUrl, {
    key: project.public,
    WebSocket,
    // A token for another channel: the server answers forbidden.
    getToken: async () => {
      calls += 1;
      const now = Math.floor(Date.now() / 1000);
      const { default: crypto } = await import("node:crypto");
      const b64 = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
      const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ channel: "private-other", exp: now + 60 })}`;
      const sig = crypto.createHmac("sha256", project.tokenSecret).update(body).digest("base64url");
      return `${body}.${sig}`;
    },
  });
  onCleanup(() => client.close());
  const errors = [];
  const sub = client.subscribe("private-mine", () => {});
  sub.on("error", (e) => errors.push(e));
  client.connect();
  await waitFor(() => errors.length === 1, { message: "the forbidden error" });
  assert.equal(errors[0].code, "forbidden");
  assert.equal(errors[0].channel, "private-mine");
  // The connection still works, and the refused channel was not asked for again.
  let news = 0;
  const got = [];
  client.subscribe("news", (m) => got.push(m)).on("subscribed", () => (news += 1));
  await waitFor(() => news === 1, { message: "news subscribed" });
  await publish(server, project.secret, "news", "e", { ok: true });
  await waitFor(() => got.length === 1, { message: "news message" });
  assert.equal(calls, 1);
  assert.equal(errors.length, 1);
});
