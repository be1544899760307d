// The examples in README.md ("Browser client") and clients/js/README.md run as written
// against the real server. Only the placeholders change: the key `pk_...` becomes the
// test project's public key and ws://127.0.0.1:8080 the test server's address.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFile, writeFile, copyFile, symlink } from "node:fs/promises";
import { createInterface } from "node:readline";
import path from "node:path";
import {
  repoRoot, tempDir, startServer, createProject, publish, staticServer,
  waitFor, perFile, onCleanup,
} from "./helpers.mjs";

const pages = perFile();

/** The first fenced block of `lang` after the line containing `marker` in `file`. */
async function codeBlock(file, marker, lang) {
  const text = await readFile(path.join(repoRoot, file), "utf8");
  const start = text.indexOf(marker);
  assert.ok(start >= 0, `${file} has "${marker}"`);
  const fence = "```" + lang + "\n";
  const open = text.indexOf(fence, start);
  assert.ok(open >= 0, `${file} has a ${lang} block after "${marker}"`);
  const close = text.indexOf("\n```", open + fence.length);
  return text.slice(open + fence.length, close + 1);
}

function placeholders(code, server, key) {
  assert.ok(code.includes("pk_...") || code.includes("RINGCAST_PUBLIC_KEY"), "the example names its key");
  return code.replaceAll("pk_...", key).replaceAll("ws://127.0.0.1:8080", `ws://${server.addr}`);
}

async function runHtmlExample(file, marker) {
  const server = await startServer();
  const project = await createProject(server);
  const snippet = placeholders(await codeBlock(file, marker, "html"), server, project.public);
  const dir = await tempDir("ringcast-readme-");
  await writeFile(path.join(dir, "index.html"), `<!doctype html>\n<meta charset="utf-8">\n${snippet}`);
  const site = await staticServer({
    "/": path.join(dir, "index.html"),
    "/ringcast.js": path.join(repoRoot, "clients/js/ringcast.js"),
  });
  const page = await pages.browser.newPage();
  const logs = [];
  page.on("console", async (msg) => {
    const args = await Promise.all(msg.args().map((a) => a.jsonValue().catch(() => undefined)));
    logs.push({ type: msg.type(), args });
  });
  page.on("pageerror", (e) => logs.push({ type: "pageerror", args: [e.message] }));
  await page.goto(`${site.url}/`);
  // The snippet has no hook for "subscribed": publish until one arrives (each publish is
  // a new message; the first ones may precede the subscription).
  const data = { id: 42 };
  const seen = await waitFor(async () => {
    await publish(server, project.secret, "news", "order.created", data);
    return logs.find((l) => l.args[0] === "order.created");
  }, { interval: 100, message: "the snippet logging the message" });
  assert.deepEqual(seen.args, ["order.created", data]);
  assert.deepEqual(logs.filter((l) => l.type === "pageerror" || l.type === "error"), []);
  await page.close();
}

test("README.md: the Browser client snippet receives a message in Chromium", async () => {
  await runHtmlExample("README.md", "## Browser client");
});

test("clients/js/README.md: the browser example receives a message in Chromium", async () => {
  await runHtmlExample("clients/js/README.md", "**Browser.**");
});

test("clients/js/README.md: the Node example, saved as subscribe.mjs beside ringcast.js, prints a message", async () => {
  const server = await startServer();
  const project = await createProject(server);
  const code = await codeBlock("clients/js/README.md", "<!-- example: node -->", "js");
  // As the README says: subscribe.mjs beside ringcast.js, with `ws` installed.
  const dir = await tempDir("ringcast-readme-node-");
  await writeFile(path.join(dir, "subscribe.mjs"), code);
  await copyFile(path.join(repoRoot, "clients/js/ringcast.js"), path.join(dir, "ringcast.js"));
  await symlink(path.join(repoRoot, "tests/browser/node_modules"), path.join(dir, "node_modules"));
  const child = spawn(process.execPath, ["subscribe.mjs"], {
    cwd: dir,
    env: { ...process.env, RINGCAST_PUBLIC_KEY: project.public, RINGCAST_WS_URL: server.wsUrl },
    stdio: ["ignore", "pipe", "pipe"],
  });
  onCleanup(() => child.kill("SIGKILL"));
  const lines = [];
  createInterface({ input: child.stdout }).on("line", (l) => lines.push(l));
  createInterface({ input: child.stderr }).on("line", (l) => lines.push(`stderr: ${l}`));
  await waitFor(() => lines.includes("subscribed: news"), { message: "subscribed: news" });
  const res = await publish(server, project.secret, "news", "order.created", { id: 42 });
  assert.equal(res.status, 202);
  await waitFor(() => lines.includes(`message: order.created {"id":42} ${res.body.id}`), {
    message: `the message line (got ${JSON.stringify(lines)})`,
  });
  assert.deepEqual(lines.slice(0, 3), ["state: connecting", "state: connected", "subscribed: news"]);
  assert.ok(!lines.some((l) => l.startsWith("stderr:") || l.startsWith("error:")), lines.join("\n"));
});
