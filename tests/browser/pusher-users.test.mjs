// pusher-js (its Node build) signing in against the real ringcast binary (issue 25,
// contract 1.3 "Users"): `signin()` through a real user-authentication endpoint that
// signs with the npm `pusher` SDK's authenticateUser, as an application backend would;
// then the SDK's terminateUserConnections ends that connection and pusher-js does not
// reconnect.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import Pusher from "pusher-js";
import { waitFor, cleanupAll, onCleanup, listenLocal } from "./helpers.mjs";
import { pusherServer, clientOptions, sdk } from "./pusher-helpers.mjs";

let server, project;

before(async () => {
  ({ server, project } = await pusherServer());
});

after(cleanupAll);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * The application's user-authentication endpoint: `authenticateUser` for the user named
 * by `?user=`, signed with the project's secret, or with a wrong one when `bad=1`.
 */
async function userAuthServer() {
  const good = sdk(server, project);
  const bad = sdk(server, project, { secret: `ts_${"x".repeat(44)}` });
  const http = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const query = new URL(req.url, "http://x").searchParams;
      const socketId = new URLSearchParams(body).get("socket_id");
      const signer = query.get("bad") === "1" ? bad : good;
      const user = { id: query.get("user"), user_info: { name: `User ${query.get("user")}` } };
      const answer = signer.authenticateUser(socketId, user);
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(answer));
    });
  });
  return listenLocal(http);
}

/** A pusher-js client whose sign-in goes to `url`; connected within 5 s. */
async function connect(url) {
  const p = new Pusher(project.public, {
    ...clientOptions(server),
    userAuthentication: { endpoint: url, transport: "ajax" },
  });
  const c = { p, states: [], errors: [], signedIn: [] };
  p.connection.bind("state_change", (s) => c.states.push(s.current));
  p.connection.bind("error", (e) => c.errors.push(e));
  p.bind("pusher:signin_success", (d) => c.signedIn.push(d));
  p.bind("pusher:error", (e) => c.errors.push(e));
  onCleanup(() => p.disconnect());
  await waitFor(() => p.connection.state === "connected", { timeout: 5000, message: "pusher-js connected" });
  return c;
}

test("signin(): pusher:signin_success with the user, then terminateUserConnections ends it for good", async () => {
  const auth = await userAuthServer();
  const ann = await connect(`${auth.url}/pusher/user-auth?user=ann`);
  ann.p.signin();
  await waitFor(() => ann.signedIn.length === 1, { timeout: 5000, message: "signin_success" });
  assert.equal(JSON.parse(ann.signedIn[0].user_data).id, "ann");
  assert.equal(ann.p.user.user_data?.id, "ann");

  const bob = await connect(`${auth.url}/pusher/user-auth?user=bob`);
  bob.p.signin();
  await waitFor(() => bob.signedIn.length === 1, { timeout: 5000, message: "bob signed in" });

  await sdk(server, project).terminateUserConnections("ann");
  await waitFor(() => ann.p.connection.state === "disconnected", {
    timeout: 5000,
    message: `ann ended (states ${ann.states.join(" ")})`,
  });
  // pusher-js does not reconnect after Pusher's 4009.
  await sleep(2000);
  assert.equal(ann.p.connection.state, "disconnected", ann.states.join(" "));
  assert.ok(ann.errors.some((e) => e?.data?.code === 4009 || e?.code === 4009), JSON.stringify(ann.errors));
  assert.equal(bob.p.connection.state, "connected", "another user is untouched");
});

test("signin() signed with a wrong secret: pusher:error 4009, no user, still connected", async () => {
  const auth = await userAuthServer();
  const c = await connect(`${auth.url}/pusher/user-auth?user=ann&bad=1`);
  c.p.signin();
  await waitFor(() => c.errors.some((e) => e?.data?.code === 4009 || e?.code === 4009), {
    timeout: 5000,
    message: `pusher:error 4009 (${JSON.stringify(c.errors)})`,
  });
  assert.equal(c.signedIn.length, 0);
  assert.equal(c.p.connection.state, "connected");
});
