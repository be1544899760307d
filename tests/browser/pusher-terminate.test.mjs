// Pusher user authentication and terminate_connections (issue 25): pusher-js (Node
// build) signs in through an application endpoint that signs with the npm `pusher`
// SDK's authenticateUser, then the same SDK's terminateUserConnections() ends that
// user's connections: pusher-js leaves "connected" and does not reconnect (ringcast
// closes it as Pusher does, 4009), while another user's client stays connected.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import Pusher from "pusher-js";
import { startServer, waitFor, cleanupAll, onCleanup, listenLocal } from "./helpers.mjs";
import { pusherProject, sdk, clientOptions } from "./pusher-helpers.mjs";

let server;
let project;
let userAuth;
let pusher;

/** The application's user-authentication endpoint: `?user=<id>` says who signs in. */
async function userAuthServer() {
  const signer = sdk(server, project);
  const http = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const user = new URL(req.url, "http://x").searchParams.get("user");
      const socketId = new URLSearchParams(body).get("socket_id");
      const auth = signer.authenticateUser(socketId, { id: user, user_info: { name: user } });
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(auth));
    });
  });
  return listenLocal(http);
}

before(async () => {
  server = await startServer();
  project = await pusherProject(server, "pusher-terminate");
  userAuth = await userAuthServer();
  pusher = sdk(server, project);
});

after(cleanupAll);

/** A pusher-js client signed in as `user`; records its states and frames. */
async function signedIn(user) {
  const p = new Pusher(project.public, {
    ...clientOptions(server),
    userAuthentication: { endpoint: `${userAuth.url}/pusher/user-auth?user=${user}`, transport: "ajax" },
  });
  const c = { p, states: [], frames: [] };
  p.connection.bind("state_change", (s) => c.states.push(s.current));
  p.connection.bind("message", (m) => c.frames.push(m));
  onCleanup(() => p.disconnect());
  p.signin();
  await waitFor(() => c.frames.some((m) => m.event === "pusher:signin_success"), {
    timeout: 5000,
    message: `${user} signed in (states ${c.states.join(" ")})`,
  });
  return c;
}

test("terminateUserConnections ends the user's pusher-js clients, which do not reconnect", async () => {
  const ann1 = await signedIn("ann");
  const ann2 = await signedIn("ann");
  const bob = await signedIn("bob");

  const res = await pusher.terminateUserConnections("ann");
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), {});

  for (const c of [ann1, ann2]) {
    await waitFor(() => c.p.connection.state !== "connected", { timeout: 5000, message: "ann's client ended" });
  }
  const seen = [ann1.states.length, ann2.states.length];
  // Give a reconnect every chance to happen (pusher-js retries within a second or two).
  await new Promise((r) => setTimeout(r, 3000));
  for (const [i, c] of [ann1, ann2].entries()) {
    assert.notEqual(c.p.connection.state, "connected", `ann ${i + 1}: ${c.states.join(" ")}`);
    assert.ok(!c.states.slice(seen[i]).includes("connected"), `ann ${i + 1} reconnected: ${c.states.join(" ")}`);
    assert.ok(!c.states.slice(seen[i]).includes("connecting"), `ann ${i + 1} tried again: ${c.states.join(" ")}`);
  }
  assert.equal(bob.p.connection.state, "connected", bob.states.join(" "));
});

test("an unknown user and a bad user id", async () => {
  const res = await pusher.terminateUserConnections("nobody-here");
  assert.equal(res.status, 200);
  await assert.rejects(pusher.terminateUserConnections("x".repeat(201)), (e) => e.status === 400);
});
