// Publish one message to ringcast from a Node backend (Node >= 18: fetch is built in).
//
//   RINGCAST_KEY=sk_... node examples/publish.mjs news order.created '{"id": 42}'
//
// Environment: RINGCAST_URL (default http://127.0.0.1:8080) and RINGCAST_KEY (a secret
// key, sk_...). Arguments: CHANNEL EVENT DATA, DATA being JSON text (an object or a
// string); by default "news", "order.created", {"id": 42}. Prints the answer and exits 0
// on 202.

const baseUrl = (process.env.RINGCAST_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const secretKey = process.env.RINGCAST_KEY;
if (!secretKey) {
  console.error("set RINGCAST_KEY to a secret key (sk_...)");
  process.exit(2);
}
const [channel = "news", event = "order.created", dataText = '{"id": 42}'] = process.argv.slice(2);

const response = await fetch(`${baseUrl}/api/v1/publish`, {
  method: "POST",
  headers: { "X-Api-Key": secretKey, "Content-Type": "application/json" },
  body: JSON.stringify({ channel, event, data: JSON.parse(dataText) }),
});
console.log(response.status, await response.text());
if (response.status === 429) {
  console.error(`over quota: retry after ${response.headers.get("Retry-After")} s`);
}
process.exit(response.status === 202 ? 0 : 1);
