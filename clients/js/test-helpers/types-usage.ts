import { Ringcast, backoffDelay, jwtExp, RingcastError, type Message } from "../ringcast.js";
const client = new Ringcast("ws://127.0.0.1:8080/api/v1/ws", {
  key: "pk_...",
  getToken: async (channel) => "jwt-for-" + channel,
  minReconnectDelayMs: 500, maxReconnectDelayMs: 20000,
});
client.on("state", (state) => { const s: "connecting" | "connected" | "disconnected" | "closed" = state; });
client.on("error", (err) => console.log(err.message));
const sub = client.subscribe<{ id: number }>("news", (msg: Message<{ id: number }>) => console.log(msg.data.id, msg.offset));
sub.on("subscribed", (info) => console.log(info.recovered, info.offset, info.epoch));
sub.on("error", (err) => {});
sub.on("unsubscribed", (reason: string) => {});
sub.on("presence", (ev) => console.log(ev.action, ev.user_id));
const m = sub.members.map((x) => x.user_id);
const ok: boolean = sub.trigger("client-typing", { on: true });
sub.unsubscribe();
client.connect();
client.close();
const d: number = backoffDelay(1, 2, 3);
const e: number | undefined = jwtExp("x");
// @ts-expect-error: unknown event
client.on("nope", () => {});
// @ts-expect-error: client events start with client-
sub.trigger("typing", {});
