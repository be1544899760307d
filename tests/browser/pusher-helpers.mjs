// Helpers of the Pusher-protocol tests (pusher-node, pusher-sdk, pusher-browser, echo):
// a project seen as a Pusher app, the auth endpoint an application backend would run
// (the npm `pusher` SDK's authorizeChannel), a raw native WebSocket client, and
// publishes through the native API. Everything started here is closed by cleanupAll.

import { createServer } from "node:http";
import WebSocket from "ws";
import PusherServer from "pusher";
import Pusher from "pusher-js";
import path from "node:path";
import {
  cli, waitKey, waitFor, onCleanup, postPublish, listenLocal, repoRoot, startServer, staticServer, launchBrowser,
} from "./helpers.mjs";

/**
 * Create a project and wait until the server knows it. Returns {id, secret, public,
 * tokenSecret, appId}: as a Pusher app, key = `public`, secret = `tokenSecret`.
 */
export async function pusherProject(server, name = "pusher-e2e", ...flags) {
  const out = await cli(server.dataDir, "project", "create", name, "--rate-limit", "1000/s", ...flags);
  const project = {
    id: out.project.id,
    secret: out.secret_key,
    public: out.public_key,
    tokenSecret: out.token_secret,
    appId: out.project.pusher_app_id,
  };
  await waitKey(server, project.secret);
  return project;
}

/** The options every pusher-js client of these tests gets (the Node and the web build). */
export function clientOptions(server, authUrl) {
  return {
    cluster: "local",
    wsHost: "127.0.0.1",
    wsPort: server.port,
    forceTLS: false,
    enabledTransports: ["ws"],
    disableStats: true,
    ...(authUrl ? { channelAuthorization: { endpoint: authUrl, transport: "ajax" } } : {}),
  };
}

/** An npm `pusher` SDK client of the project (the app's backend). */
export function sdk(server, project, overrides = {}) {
  return new PusherServer({
    appId: project.appId,
    key: project.public,
    secret: project.tokenSecret,
    host: "127.0.0.1",
    port: String(server.port),
    useTLS: false,
    ...overrides,
  });
}

/**
 * The application's auth endpoint on 127.0.0.1:0, answering `/pusher/auth` and
 * `/broadcasting/auth` (and any other path) with the SDK's authorizeChannel, with CORS
 * headers for pages of another origin. The query says who asks: `user=<id>` (presence
 * member; `numeric=1` sends the id as a JSON number), `bad=1` signs with a wrong secret.
 * Returns {url, requests, close()}; `requests` logs {socket_id, channel_name, user}.
 */
export async function authServer(server, project) {
  const good = sdk(server, project);
  const bad = sdk(server, project, { secret: `ts_${"x".repeat(44)}` });
  const requests = [];
  const http = createServer((req, res) => {
    const cors = {
      "Access-Control-Allow-Origin": req.headers.origin || "*",
      "Access-Control-Allow-Methods": "POST, OPTIONS",
      "Access-Control-Allow-Headers": req.headers["access-control-request-headers"] || "*",
      "Access-Control-Allow-Credentials": "true",
    };
    if (req.method === "OPTIONS") {
      res.writeHead(204, cors).end();
      return;
    }
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const query = new URL(req.url, "http://x").searchParams;
      const form = new URLSearchParams(body);
      const socketId = form.get("socket_id");
      const channel = form.get("channel_name");
      const user = query.get("user");
      requests.push({ socket_id: socketId, channel_name: channel, user });
      try {
        const signer = query.get("bad") === "1" ? bad : good;
        let presence;
        if (channel?.startsWith("presence-")) {
          if (!user) throw new Error("a presence channel needs ?user=");
          const userId = query.get("numeric") === "1" ? Number(user) : user;
          presence = { user_id: userId, user_info: { id: user, name: `User ${user}` } };
        }
        const auth = signer.authorizeChannel(socketId, channel, presence);
        res.writeHead(200, { ...cors, "Content-Type": "application/json" }).end(JSON.stringify(auth));
      } catch (e) {
        res.writeHead(403, { ...cors, "Content-Type": "application/json" }).end(JSON.stringify({ error: e.message }));
      }
    });
  });
  return { ...(await listenLocal(http)), requests };
}

/**
 * One server for a test file with a Pusher project whose client events are on (off by
 * default; the switch reaches the server within a second) and its auth endpoint.
 * Returns {server, project, auth}.
 */
export async function pusherServer() {
  const server = await startServer();
  const project = await pusherProject(server);
  await cli(server.dataDir, "project", "set-limits", project.id, "--client-events", "on");
  return { server, project, auth: await authServer(server, project) };
}

/**
 * The set-up of a browser test file driving pusher-js in a page: one server, a Pusher
 * project with client events on, its auth endpoint, a static server for
 * `tests/browser/page/<page>` at "/" with pusher-js's browser build at /pusher.min.js
 * (and `scripts`: more paths under node_modules by route), and Chromium.
 * Returns {server, project, auth, site, browser}.
 */
export async function pusherPages(page, scripts = {}) {
  const { server, project, auth } = await pusherServer();
  const modules = path.join(repoRoot, "tests/browser/node_modules");
  const routes = { "/": path.join(repoRoot, "tests/browser/page", page) };
  for (const [route, file] of Object.entries({ "/pusher.min.js": "pusher-js/dist/web/pusher.min.js", ...scripts })) {
    routes[route] = path.join(modules, file);
  }
  const [site, browser] = await Promise.all([staticServer(routes), launchBrowser()]);
  return { server, project, auth, site, browser };
}

/**
 * POST /api/v1/publish (native) with `extra` fields (e.g. socket_id); returns
 * {status, body}.
 */
export function nativePublish(server, project, channel, event, data, extra = {}) {
  return postPublish(server, project.secret, { channel, event, data, ...extra });
}

/**
 * A native WebSocket client (`/api/v1/ws?key=pk_...`) speaking raw JSON frames.
 * Resolves once `connected` arrived. {frames, connectionId, send(obj), subscribe(channel,
 * token?), messages(channel?), close()}.
 */
export async function nativeClient(server, key) {
  const ws = new WebSocket(`${server.wsUrl}?key=${key}`);
  const frames = [];
  ws.on("message", (data) => frames.push(JSON.parse(String(data))));
  const closed = new Promise((resolve) => ws.once("close", (code) => resolve(code)));
  onCleanup(() => ws.close());
  await waitFor(() => frames.some((f) => f.type === "connected"), { timeout: 5000, message: "native connected" });
  const client = {
    ws,
    frames,
    closed,
    connectionId: frames.find((f) => f.type === "connected").connection_id,
    send: (obj) => ws.send(JSON.stringify(obj)),
    async subscribe(channel, token) {
      client.send({ type: "subscribe", channel, ...(token ? { token } : {}) });
      return waitFor(() => frames.find((f) => f.type === "subscribed" && f.channel === channel), {
        timeout: 5000,
        message: `native subscribed to ${channel} (frames: ${JSON.stringify(frames.filter((f) => f.type === "error"))})`,
      });
    },
    messages: (channel) => frames.filter((f) => f.type === "message" && (!channel || f.channel === channel)),
    presence: (channel) => frames.filter((f) => f.type === "presence" && (!channel || f.channel === channel)),
    close: () => ws.close(),
  };
  return client;
}

/**
 * Wait until the server takes `key` on `/app/{key}` (a new public key reaches the
 * running server within a second): a raw connection gets connection_established.
 */
export async function waitPusherKey(server, key) {
  await waitFor(
    () =>
      new Promise((resolve) => {
        const ws = new WebSocket(`ws://${server.addr}/app/${key}?protocol=7`);
        ws.once("message", (data) => {
          resolve(JSON.parse(String(data)).event === "pusher:connection_established");
          ws.close();
        });
        ws.once("error", () => resolve(false));
      }),
    { timeout: 5000, interval: 100, message: "the server to take the new public key" },
  );
}

export const SOCKET_ID = /^\d+\.\d+$/;

/**
 * A pusher-js client (the Node build), connected within 5 s, its auth requests going to
 * `auth` (an authServer) if given. `user` (and `numeric`) name the presence member the
 * auth endpoint signs for; `bad` makes it sign with a wrong secret. Returns {p, states,
 * errors, frames}: connection state changes (after the first "connecting"), connection
 * errors, and every frame received after the handshake, `data` decoded as pusher-js does.
 */
export async function connectPusher({ server, key, auth, user, numeric = false, bad = false }) {
  const q = new URLSearchParams();
  if (user !== undefined) q.set("user", String(user));
  if (numeric) q.set("numeric", "1");
  if (bad) q.set("bad", "1");
  const p = new Pusher(key, clientOptions(server, auth ? `${auth.url}/pusher/auth?${q}` : undefined));
  const c = { p, user, states: [], errors: [], frames: [] };
  p.connection.bind("state_change", (s) => c.states.push(s.current));
  p.connection.bind("error", (e) => c.errors.push(e));
  p.connection.bind("message", (m) => c.frames.push(m));
  onCleanup(() => p.disconnect());
  await waitFor(() => p.connection.state === "connected", {
    timeout: 5000,
    message: `pusher-js connected (states ${c.states.join(" ")}; errors ${JSON.stringify(c.errors)})`,
  });
  return c;
}

/**
 * Subscribe a connectPusher client to `name`; collects the channel's events (other than
 * pusher:*), subscription errors, members added and removed. With `wait` (default),
 * resolves once the subscription succeeded or failed.
 */
export async function subscribePusher(c, name, { wait = true } = {}) {
  const channel = c.p.subscribe(name);
  const s = { channel, events: [], errors: [], succeeded: 0, added: [], removed: [] };
  channel.bind("pusher:subscription_succeeded", () => (s.succeeded += 1));
  channel.bind("pusher:subscription_error", (e) => s.errors.push(e));
  channel.bind("pusher:member_added", (m) => s.added.push(m));
  channel.bind("pusher:member_removed", (m) => s.removed.push(m));
  channel.bind_global((event, data) => {
    if (!event.startsWith("pusher:")) s.events.push({ event, data });
  });
  if (wait) {
    await waitFor(() => s.succeeded > 0 || s.errors.length > 0, { timeout: 5000, message: `${name} answered` });
  }
  return s;
}

/** The events named `name` a subscribePusher subscription collected. */
export const eventsNamed = (s, name) => s.events.filter((e) => e.event === name);
