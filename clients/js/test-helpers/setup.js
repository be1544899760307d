// A client of the unit tests, wired to a fake clock, a fake socket class and a fixed
// random value (shared by the test files of this folder's client).

import { Ringcast } from "../ringcast.js";
import { FakeClock, fakeSocketClass } from "./fakes.js";

/** A client wired to a fake clock, a fake socket class and a fixed random value. */
export function setup(options = {}) {
  const clock = new FakeClock();
  const Socket = fakeSocketClass();
  const states = [];
  const errors = [];
  const client = new Ringcast("ws://127.0.0.1:9/api/v1/ws", {
    key: "pk_test",
    WebSocket: Socket,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    now: clock.now,
    random: () => 0.5,
    minReconnectDelayMs: 100,
    maxReconnectDelayMs: 1000,
    ...options,
  });
  client.on("state", (s) => states.push(s));
  client.on("error", (e) => errors.push(e));
  return { clock, Socket, client, states, errors };
}
