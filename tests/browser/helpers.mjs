// Shared helpers for the end-to-end tests: the real ringcast binary on 127.0.0.1:0 (as
// tests/common/mod.rs starts it), its admin CLI, a tiny static file server, Debian's
// Chromium through playwright-core, and polling. Every process started here is killed
// when the test file ends, even on failure.

import { spawn, execFile } from "node:child_process";
import { createServer } from "node:http";
import { mkdtemp, rm, readFile, writeFile } from "node:fs/promises";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { createHmac } from "node:crypto";
import { before, after } from "node:test";

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const BIN = path.resolve(repoRoot, process.env.RINGCAST_BIN || "target/debug/ringcast");
export const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

// ---- cleanup -----------------------------------------------------------------------

const children = new Set(); // live child processes we started
const cleanups = []; // async cleanups (servers, browsers, temp dirs), last first

process.on("exit", () => {
  // Last resort (a crash or an early exit): kill our own children by pid.
  for (const child of children) {
    try {
      process.kill(child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
});

/** Register an async cleanup; `cleanupAll` runs them in reverse order. */
export function onCleanup(fn) {
  cleanups.push(fn);
}

/** Run every registered cleanup (use in `after`). Never throws. */
export async function cleanupAll() {
  while (cleanups.length) {
    const fn = cleanups.pop();
    try {
      await fn();
    } catch (e) {
      console.error("cleanup failed:", e);
    }
  }
}

/** A temporary directory removed at cleanup. */
export async function tempDir(prefix = "ringcast-e2e-") {
  const dir = await mkdtemp(path.join(tmpdir(), prefix));
  onCleanup(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

// ---- polling -----------------------------------------------------------------------

/**
 * Poll `check` (sync or async) until it returns a truthy value, and return that value.
 * Fails with `message` (and the last value or error) after `timeout` ms.
 */
export async function waitFor(check, { timeout = 10000, interval = 25, message = "condition" } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      const detail = last instanceof Error ? last.message : JSON.stringify(last);
      throw new Error(`timed out after ${timeout} ms waiting for ${message} (last: ${detail})`);
    }
    await new Promise((r) => setTimeout(r, interval));
  }
}

// ---- the ringcast binary -----------------------------------------------------------

/** Run the admin CLI on a data directory; returns its JSON output. */
export function cli(dataDir, ...args) {
  return new Promise((resolve, reject) => {
    execFile(BIN, ["--data-dir", dataDir, ...args], { timeout: 20000 }, (err, stdout, stderr) => {
      if (err) {
        reject(new Error(`ringcast ${args.join(" ")} failed: ${err.message}\n${stderr}`));
        return;
      }
      try {
        resolve(JSON.parse(stdout));
      } catch {
        reject(new Error(`ringcast ${args.join(" ")} printed no JSON: ${stdout}`));
      }
    });
  });
}

/**
 * Start `ringcast serve` on `listen` (default 127.0.0.1:0) with its own data directory
 * (a new temporary one unless given). Resolves once it printed its address.
 * Returns {url, wsUrl, port, dataDir, devKeys, stop(), process}.
 */
export async function startServer({ dataDir, listen = "127.0.0.1:0", dev = false, config = "", workers = 2 } = {}) {
  if (!dataDir) dataDir = await tempDir("ringcast-data-");
  const args = ["--data-dir", dataDir, "serve", "--listen", listen, "--workers", String(workers)];
  if (config) {
    const configDir = await tempDir("ringcast-config-");
    const configFile = path.join(configDir, "ringcast.toml");
    await writeFile(configFile, config);
    args.push("--config", configFile);
  }
  if (dev) args.push("--dev");
  const child = spawn(BIN, args, {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG || "warn" },
  });
  children.add(child);
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => {
    children.delete(child);
    resolve({ code, signal });
  }));
  let stderr = "";
  child.stderr.on("data", (d) => {
    stderr = (stderr + d).slice(-4000);
  });
  const lines = createInterface({ input: child.stdout });
  let devKeys = null;
  const addr = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not print its address in 20 s\n${stderr}`)), 20000);
    lines.on("line", (line) => {
      if (line.startsWith("{") && line.includes("public_key")) {
        try {
          devKeys = JSON.parse(line);
        } catch {
          // not JSON after all
        }
      }
      const m = /^ringcast listening on https?:\/\/(\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`ringcast serve exited (${code ?? signal}) before listening\n${stderr}`));
    });
  });
  const port = Number(addr.split(":").pop());
  let stopped = false;
  const server = {
    process: child,
    addr,
    port,
    dataDir,
    devKeys,
    url: `http://${addr}`,
    wsUrl: `ws://${addr}/api/v1/ws`,
    /** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
    async stop(graceMs = 8000) {
      if (stopped) return;
      stopped = true;
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
        await exited;
        clearTimeout(timer);
      }
    },
  };
  onCleanup(() => server.stop(2000));
  return server;
}

/** Create a project with the CLI and wait until the running server knows its keys. */
export async function createProject(server, name = "e2e") {
  const out = await cli(server.dataDir, "project", "create", name, "--rate-limit", "1000/s");
  const project = {
    id: out.project.id,
    secret: out.secret_key,
    public: out.public_key,
    tokenSecret: out.token_secret,
  };
  await waitKey(server, project.secret);
  return project;
}

/** Wait until the server accepts a secret key (a publish of `{}` stops answering 401). */
export async function waitKey(server, secret) {
  await waitFor(
    async () => {
      const res = await fetch(`${server.url}/api/v1/publish`, {
        method: "POST",
        headers: { "X-Api-Key": secret, "Content-Type": "application/json" },
        body: "{}",
      });
      await res.arrayBuffer();
      return res.status !== 401;
    },
    { timeout: 5000, message: "the server to pick up the new key" },
  );
}

/** A fetch response as {status, body}: the body parsed as JSON, or its text when it is not JSON. */
export async function answerOf(res) {
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) };
  } catch {
    return { status: res.status, body: text };
  }
}

/** POST /api/v1/publish with Node's fetch, `fields` as the JSON body; returns {status, body}. */
export async function postPublish(server, secret, fields) {
  const headers = { "X-Api-Key": secret, "Content-Type": "application/json" };
  const res = await fetch(`${server.url}/api/v1/publish`, { method: "POST", headers, body: JSON.stringify(fields) });
  return answerOf(res);
}

/** POST /api/v1/publish with Node's fetch; returns {status, body}. */
export function publish(server, secret, channel, event, data) {
  return postPublish(server, secret, { channel, event, data });
}

/** GET a REST path (e.g. "/api/v1/presence?channel=...") with a secret key; returns {status, body}. */
export async function apiGet(server, secret, pathAndQuery) {
  return answerOf(await fetch(`${server.url}${pathAndQuery}`, { headers: { "X-Api-Key": secret } }));
}

/**
 * A channel token as an application backend signs it: a JWT, HS256 with the project's
 * token secret (`ts_...`), over `claims` (`channel`, `exp`, and for presence `sub`, `info`).
 */
export function signToken(tokenSecret, claims) {
  const b64 = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}`;
  const sig = createHmac("sha256", tokenSecret).update(body).digest("base64url");
  return `${body}.${sig}`;
}

// ---- static files ------------------------------------------------------------------

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
};

/**
 * Serve `routes` ({"/path": "/file/on/disk"}) on 127.0.0.1:0; anything else is 404.
 * Returns {url, close()}.
 */
export async function staticServer(routes) {
  const server = createServer(async (req, res) => {
    const pathname = new URL(req.url, "http://x").pathname;
    const file = routes[pathname];
    if (!file && pathname === "/favicon.ico") {
      res.writeHead(204).end();
      return;
    }
    if (!file) {
      res.writeHead(404, { "Content-Type": "text/plain" }).end("not found");
      return;
    }
    try {
      const body = await readFile(file);
      res.writeHead(200, {
        "Content-Type": TYPES[path.extname(file)] || "application/octet-stream",
        "Cache-Control": "no-store",
      });
      res.end(body);
    } catch (e) {
      res.writeHead(500, { "Content-Type": "text/plain" }).end(String(e));
    }
  });
  return listenLocal(server);
}

/**
 * Listen with a node:http `server` on 127.0.0.1:0; closed (its connections too) at
 * cleanup. Returns {url, close()}.
 */
export async function listenLocal(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const close = () =>
    new Promise((resolve) => {
      server.closeAllConnections?.();
      server.close(() => resolve());
    });
  onCleanup(close);
  return { url: `http://127.0.0.1:${server.address().port}`, close };
}

// ---- the browser -------------------------------------------------------------------

/**
 * Launch Debian's Chromium (never a downloaded one) with a fresh profile.
 * Returns a playwright BrowserContext; closed at cleanup.
 */
export async function launchBrowser() {
  const { chromium } = await import("playwright-core");
  const profile = mkdtempSync(path.join(tmpdir(), "ringcast-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 800 },
    timeout: 30000,
  });
  onCleanup(async () => {
    await context.close().catch(() => {});
    rmSync(profile, { recursive: true, force: true });
  });
  return context;
}

/** Collect a page's console errors and uncaught exceptions (for failure messages). */
export function watchPage(page) {
  const problems = [];
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("console", (msg) => {
    // The browser's own favicon request is not the page's doing.
    if (msg.type() === "error" && !/\/favicon\.ico$/.test(msg.location()?.url ?? "")) {
      problems.push(`console.error: ${msg.text()}`);
    }
  });
  return problems;
}

/**
 * A test file's shared set-up: registers its hooks, `setUp` once before its tests (its
 * result's fields fill the returned object, e.g. {site, browser}) and `cleanupAll` after
 * them. The default set-up launches Chromium only.
 */
export function perFile(setUp = async () => ({ browser: await launchBrowser() })) {
  const fixture = {};
  before(async () => Object.assign(fixture, await setUp()));
  after(cleanupAll);
  return fixture;
}

/**
 * The set-up of a browser test file driving the JavaScript client in a page: a static
 * server for tests/browser/page/index.html at "/" and clients/js/ringcast.js, and
 * Chromium. Returns {site, browser}.
 */
export async function ringcastPages() {
  const routes = {
    "/": path.join(repoRoot, "tests/browser/page/index.html"),
    "/ringcast.js": path.join(repoRoot, "clients/js/ringcast.js"),
  };
  const [site, browser] = await Promise.all([staticServer(routes), launchBrowser()]);
  return { site, browser };
}

// ---- a TCP proxy that can play dead ------------------------------------------------

/**
 * A TCP proxy on 127.0.0.1:0 to `target` ("host:port"). `freeze()` makes every
 * connection open now go silent both ways without closing it (a dead network path);
 * connections made later work normally. Returns {port, connections, freeze(), close()}.
 */
export async function tcpProxy(target) {
  const net = await import("node:net");
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.split(":").pop())];
  const pairs = new Set();
  const proxy = {
    connections: 0,
    freeze() {
      for (const pair of pairs) pair.frozen = true;
    },
  };
  const server = net.createServer((client) => {
    proxy.connections += 1;
    const upstream = net.connect(port, host);
    const pair = { client, upstream, frozen: false };
    pairs.add(pair);
    const forward = (from, to) => {
      from.on("data", (chunk) => {
        if (!pair.frozen) to.write(chunk);
      });
      from.on("end", () => {
        if (!pair.frozen) to.end();
      });
      from.on("error", () => to.destroy());
      from.on("close", () => {
        pairs.delete(pair);
        if (!pair.frozen) to.destroy();
      });
    };
    forward(client, upstream);
    forward(upstream, client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxy.port = server.address().port;
  proxy.close = () =>
    new Promise((resolve) => {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream.destroy();
      }
      server.close(() => resolve());
    });
  onCleanup(proxy.close);
  return proxy;
}
