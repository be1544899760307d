// The npm `pusher` server SDK (pinned in package.json) against ringcast's Pusher REST API
// (`/apps/{app_id}/...`, docs/design/pusher.md sections 4 and 6.4): trigger to one and to
// three channels, with socket_id and info, triggerBatch (and its all-or-nothing refusal),
// and the channel queries, checked through pusher-js (Node build) and native clients.
// `new Pusher({appId, key, secret, host, port, useTLS: false})` with the project's
// pusher_app_id, a public key and the token secret. One server for the file.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { startServer, signToken, waitFor, cleanupAll, cli, onCleanup } from "./helpers.mjs";
import {
  pusherProject, authServer, sdk, nativeClient, nativePublish, connectPusher, subscribePusher, eventsNamed,
} from "./pusher-helpers.mjs";

let server;
let project;
let auth;
let pusher;

before(async () => {
  // The webhook test's receiver listens on 127.0.0.1: private addresses allowed.
  server = await startServer({ config: "webhook_allow_private_addresses = true\n" });
  project = await pusherProject(server);
  auth = await authServer(server, project);
  pusher = sdk(server, project);
});

after(cleanupAll);

const connect = (opts = {}) => connectPusher({ server, key: project.public, auth, ...opts });

/** An SDK call's answer as {status, body}, whether it resolved or rejected. */
async function answer(call) {
  try {
    const res = await call;
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : text };
  } catch (e) {
    if (e.status === undefined) throw e;
    let body = e.body;
    try {
      body = JSON.parse(e.body);
    } catch {
      // not JSON
    }
    return { status: e.status, body };
  }
}

test("trigger to one channel: pusher-js gets the object, a native client the SDK's string", async () => {
  const c = await connect();
  const s = await subscribePusher(c, "orders");
  const native = await nativeClient(server, project.public);
  await native.subscribe("orders");
  const res = await answer(pusher.trigger("orders", "order.created", { id: 42 }));
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.deepEqual(res.body, {});
  await waitFor(() => eventsNamed(s, "order.created").length === 1, { message: "the event in pusher-js" });
  assert.deepEqual(eventsNamed(s, "order.created")[0].data, { id: 42 });
  await waitFor(() => native.messages("orders").length === 1, { message: "the event in the native client" });
  const m = native.messages("orders")[0];
  assert.equal(m.event, "order.created");
  // The SDK sends data as a string; a native client receives that string, unparsed.
  assert.equal(m.data, '{"id":42}');
  assert.equal(typeof m.id, "string");
});

test("trigger to three channels, and with a socket_id that leaves that connection out", async () => {
  const a = await connect();
  const b = await connect();
  const channels = ["multi-1", "multi-2", "multi-3"];
  const subsA = [];
  const subsB = [];
  for (const ch of channels) {
    subsA.push(await subscribePusher(a, ch));
    subsB.push(await subscribePusher(b, ch));
  }
  assert.equal((await answer(pusher.trigger(channels, "fan", { n: 1 }))).status, 200);
  for (const s of [...subsA, ...subsB]) {
    await waitFor(() => eventsNamed(s, "fan").length === 1, { message: `fan in ${s.channel.name}` });
    assert.deepEqual(eventsNamed(s, "fan")[0].data, { n: 1 });
  }

  const skip = await answer(pusher.trigger("multi-1", "skip-a", "not for a", { socket_id: a.p.connection.socket_id }));
  assert.equal(skip.status, 200, JSON.stringify(skip.body));
  assert.equal((await answer(pusher.trigger("multi-1", "all", "for everyone"))).status, 200);
  await waitFor(() => eventsNamed(subsA[0], "all").length === 1 && eventsNamed(subsB[0], "all").length === 1, {
    message: "the last event in both",
  });
  assert.deepEqual(subsA[0].events.map((e) => e.event), ["fan", "all"]);
  assert.deepEqual(subsB[0].events.map((e) => [e.event, e.data]), [["fan", { n: 1 }], ["skip-a", "not for a"], ["all", "for everyone"]]);

  // info: subscription_count per channel published to.
  const info = await answer(pusher.trigger(["multi-2", "multi-3"], "counted", {}, { info: "subscription_count" }));
  assert.equal(info.status, 200, JSON.stringify(info.body));
  assert.deepEqual(info.body, {
    channels: { "multi-2": { subscription_count: 2 }, "multi-3": { subscription_count: 2 } },
  });
});

test("triggerBatch: delivered in order; one invalid event refuses the whole batch", async () => {
  const c = await connect();
  const s = await subscribePusher(c, "batch");
  const other = await subscribePusher(c, "batch-other");
  const res = await answer(
    pusher.triggerBatch([
      { channel: "batch", name: "first", data: { n: 1 } },
      { channel: "batch-other", name: "second", data: "two" },
      { channel: "batch", name: "third", data: { n: 3 } },
    ]),
  );
  assert.equal(res.status, 200, JSON.stringify(res.body));
  await waitFor(() => s.events.length === 2 && other.events.length === 1, { message: "the batch" });
  assert.deepEqual(s.events, [{ event: "first", data: { n: 1 } }, { event: "third", data: { n: 3 } }]);
  assert.deepEqual(other.events, [{ event: "second", data: "two" }]);

  // A reserved event name in the middle: 400 naming its index, and nothing published.
  const bad = await answer(
    pusher.triggerBatch([
      { channel: "batch", name: "never-1", data: {} },
      { channel: "batch", name: "pusher:reserved", data: {} },
      { channel: "batch", name: "never-2", data: {} },
    ]),
  );
  assert.equal(bad.status, 400, JSON.stringify(bad.body));
  assert.equal(bad.body?.error?.index ?? bad.body?.index, 1, JSON.stringify(bad.body));
  assert.equal((await nativePublish(server, project, "batch", "after", {})).status, 202);
  await waitFor(() => eventsNamed(s, "after").length === 1, { message: "the publish after" });
  assert.deepEqual(s.events.map((e) => e.event), ["first", "third", "after"]);
});

test("channel queries: /channels with filter_by_prefix and user_count, /channels/{c} with info, /channels/{c}/users", async () => {
  const ROOM = "presence-sdk-room";
  const alice = await connect({ user: "alice" });
  const alice2 = await connect({ user: "alice" });
  const ten = await connect({ user: 10, numeric: true });
  for (const c of [alice, alice2, ten]) {
    const s = await subscribePusher(c, ROOM);
    assert.deepEqual(s.errors, []);
  }
  const native = await nativeClient(server, project.public);
  await native.subscribe(ROOM, signToken(project.tokenSecret, {
    channel: ROOM, sub: "carol", exp: Math.floor(Date.now() / 1000) + 600,
  }));
  const pub = await connect();
  await subscribePusher(pub, "public-sdk");

  const list = await answer(pusher.get({ path: "/channels", params: { filter_by_prefix: "presence-", info: "user_count" } }));
  assert.equal(list.status, 200, JSON.stringify(list.body));
  assert.deepEqual(list.body, { channels: { [ROOM]: { user_count: 3 } } });

  const all = await answer(pusher.get({ path: "/channels" }));
  assert.equal(all.status, 200, JSON.stringify(all.body));
  assert.ok(all.body.channels[ROOM] && all.body.channels["public-sdk"], JSON.stringify(all.body));

  const one = await answer(pusher.get({ path: `/channels/${ROOM}`, params: { info: "user_count,subscription_count" } }));
  assert.equal(one.status, 200, JSON.stringify(one.body));
  assert.deepEqual(one.body, { occupied: true, user_count: 3, subscription_count: 4 });

  const empty = await answer(pusher.get({ path: "/channels/presence-nobody", params: { info: "user_count" } }));
  assert.equal(empty.status, 200, JSON.stringify(empty.body));
  assert.deepEqual(empty.body, { occupied: false, user_count: 0 });

  const users = await answer(pusher.get({ path: `/channels/${ROOM}/users` }));
  assert.equal(users.status, 200, JSON.stringify(users.body));
  assert.deepEqual(users.body.users.map((u) => u.id).sort(), ["10", "alice", "carol"]);

  // user_count of a channel that is not a presence channel is refused, never {}.
  const wrong = await answer(pusher.get({ path: "/channels/public-sdk", params: { info: "user_count" } }));
  assert.equal(wrong.status, 400, JSON.stringify(wrong.body));

  // One member leaves: the counts follow.
  ten.p.disconnect();
  await waitFor(
    async () => (await answer(pusher.get({ path: `/channels/${ROOM}`, params: { info: "user_count" } }))).body.user_count === 2,
    { message: "user 10 gone" },
  );
});

test("webhooks ringcast sends are valid to the SDK's webhook validator (key and signature)", async () => {
  // A receiver on a free port that keeps every request's headers and raw body.
  const got = [];
  const receiver = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      got.push({ headers: req.headers, rawBody: Buffer.concat(chunks).toString("utf8") });
      res.writeHead(200).end();
    });
  });
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  onCleanup(() => new Promise((resolve) => receiver.close(resolve)));
  const url = `http://127.0.0.1:${receiver.address().port}/hook`;
  await cli(server.dataDir, "project", "set-webhook", project.id, url, "--events", "channel_occupied");
  // A subscriber makes the channel occupied; the webhook follows within a second or so.
  const c = await connect();
  await waitFor(
    async () => {
      await subscribePusher(c, `hooked-${got.length}-${Date.now()}`);
      return got.length > 0;
    },
    { timeout: 15000, interval: 1500, message: "a webhook request" },
  );
  const hook = pusher.webhook({ headers: got[0].headers, rawBody: got[0].rawBody });
  assert.equal(hook.isValid(), true, JSON.stringify(got[0]));
  assert.equal(hook.getEvents()[0].name, "channel_occupied");
  // A body changed on the way is not valid.
  const forged = pusher.webhook({ headers: got[0].headers, rawBody: got[0].rawBody.replace("occupied", "vacated") });
  assert.equal(forged.isValid(), false);
});
