// examples/publish.py (Python requests) and examples/publish.mjs (Node fetch) against the
// real server: a WebSocket subscriber (the `ws` package) receives what each publishes.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import path from "node:path";
import WebSocket from "ws";
import { repoRoot, startServer, createProject, waitFor, cleanupAll, onCleanup } from "./helpers.mjs";

after(cleanupAll);

const PYTHON = process.env.PYTHON || "python3";

/** A raw subscriber: resolves once subscribed; `frames` collects message frames. */
async function subscriber(server, key, channel) {
  const ws = new WebSocket(`${server.wsUrl}?key=${key}`);
  onCleanup(() => ws.terminate());
  const frames = [];
  let subscribed = false;
  ws.on("message", (data) => {
    const f = JSON.parse(String(data));
    if (f.type === "connected") ws.send(JSON.stringify({ type: "subscribe", channel }));
    if (f.type === "subscribed") subscribed = true;
    if (f.type === "message") frames.push(f);
  });
  ws.on("error", () => {});
  await waitFor(() => subscribed, { message: `subscribed to ${channel}` });
  return frames;
}

function run(cmd, args, env) {
  return new Promise((resolve) => {
    execFile(cmd, args, { env: { ...process.env, ...env }, timeout: 30000, cwd: repoRoot }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr });
    });
  });
}

const cases = [
  ["examples/publish.py (requests)", PYTHON, "examples/publish.py"],
  ["examples/publish.mjs (fetch)", process.execPath, "examples/publish.mjs"],
];

for (const [name, cmd, script] of cases) {
  test(`${name} publishes; a WebSocket subscriber receives it`, async () => {
    const server = await startServer();
    const project = await createProject(server);
    const frames = await subscriber(server, project.public, "orders");
    const env = { RINGCAST_URL: server.url, RINGCAST_KEY: project.secret };
    const out = await run(cmd, [path.join(repoRoot, script), "orders", "order.created", '{"id": 7, "name": "Zoë"}'], env);
    assert.equal(out.code, 0, `${out.stdout}\n${out.stderr}`);
    const [status, body] = [out.stdout.slice(0, 3), JSON.parse(out.stdout.slice(4))];
    assert.equal(status, "202");
    await waitFor(() => frames.length === 1, { message: "the published message" });
    assert.deepEqual(frames[0], {
      type: "message", channel: "orders", event: "order.created", data: { id: 7, name: "Zoë" }, id: body.id,
    });

    // A wrong key is a non-zero exit, and nothing is delivered.
    const bad = await run(cmd, [path.join(repoRoot, script), "orders", "x", "{}"], { ...env, RINGCAST_KEY: "sk_wrong" });
    assert.notEqual(bad.code, 0);
    assert.match(bad.stdout, /^401 /);
    assert.equal(frames.length, 1);
  });
}
