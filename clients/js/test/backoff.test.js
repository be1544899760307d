import { test } from "node:test";
import assert from "node:assert/strict";
import { backoffDelay, closeDelay, jwtExp } from "../ringcast.js";
import { fakeJwt } from "../test-helpers/fakes.js";

test("backoff stays between min and max for every attempt and random value", () => {
  for (let attempt = 0; attempt < 40; attempt++) {
    for (const r of [0, 0.001, 0.25, 0.5, 0.999999]) {
      const d = backoffDelay(attempt, 500, 20000, () => r);
      assert.ok(d >= 500 && d <= 20000, `attempt ${attempt} r ${r}: ${d}`);
    }
  }
});

test("backoff ceiling doubles per attempt until the maximum", () => {
  const ceiling = (attempt) => backoffDelay(attempt, 500, 20000, () => 1);
  assert.deepEqual(
    [0, 1, 2, 3, 4, 5, 6, 10].map(ceiling),
    [1000, 2000, 4000, 8000, 16000, 20000, 20000, 20000],
  );
  // The floor is always the minimum (random 0).
  for (let attempt = 0; attempt < 10; attempt++) {
    assert.equal(backoffDelay(attempt, 500, 20000, () => 0), 500);
  }
});

test("backoff is full jitter: delays spread over the whole window", () => {
  let seed = 42;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const delays = Array.from({ length: 2000 }, () => backoffDelay(8, 500, 20000, random));
  const min = Math.min(...delays);
  const max = Math.max(...delays);
  assert.ok(min < 1500, `smallest ${min}`);
  assert.ok(max > 19000, `largest ${max}`);
  const buckets = new Array(4).fill(0);
  for (const d of delays) buckets[Math.min(3, Math.floor(((d - 500) / 19500) * 4))]++;
  for (const b of buckets) assert.ok(b > 350, `uneven spread ${buckets}`);
  assert.ok(new Set(delays).size > 500, "delays repeat: no jitter");
});

test("backoff with min equal to max is constant; huge attempts do not overflow", () => {
  assert.equal(backoffDelay(3, 1000, 1000, Math.random), 1000);
  assert.equal(backoffDelay(1e9, 100, 5000, () => 1), 5000);
  assert.ok(Number.isFinite(backoffDelay(5000, 100, 5000, () => 0.5)));
});

test("jwtExp reads exp without verifying, and tolerates junk", () => {
  assert.equal(jwtExp(fakeJwt({ channel: "private-a", exp: 1234567890 })), 1234567890);
  assert.equal(jwtExp(fakeJwt({ channel: "private-a" })), undefined);
  assert.equal(jwtExp("not a jwt"), undefined);
  assert.equal(jwtExp("a.!!!.c"), undefined);
  assert.equal(jwtExp(undefined), undefined);
});

test("closeDelay: retry_after from a 1013, bounded; 1001 spread; other codes none", () => {
  assert.equal(closeDelay(1013, "retry_after=3", 500, 3000, () => 0), 3000);
  assert.equal(closeDelay(1013, "retry_after=3", 500, 3000, () => 0.5), 3500);
  assert.equal(closeDelay(1013, "retry_after=0", 500, 3000, () => 0), 1000);
  assert.equal(closeDelay(1013, "retry_after=9999", 500, 3000, () => 0), 60000);
  assert.equal(closeDelay(1013, "xretry_after=3", 500, 3000, () => 0), undefined);
  assert.equal(closeDelay(1013, "", 500, 3000, () => 0), undefined);
  assert.equal(closeDelay(1013, undefined, 500, 3000, () => 0), undefined);
  assert.equal(closeDelay(1001, "", 500, 3000, () => 0), 500);
  assert.equal(closeDelay(1001, "", 500, 3000, () => 1), 3000);
  assert.equal(closeDelay(1006, "", 500, 3000, () => 1), undefined);
  assert.equal(closeDelay(4008, "retry_after=3", 500, 3000, () => 1), undefined);
});
