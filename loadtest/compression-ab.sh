#!/usr/bin/env bash
# compression-ab.sh: one loadtest run against a fresh single ringcast node, with the
# node's own byte counters around it (issue 23: compression on vs off). By hand only.
#
#   loadtest/compression-ab.sh LABEL LOADTEST-ARGS...
#   e.g. loadtest/compression-ab.sh wide-4k-on fanout --subs 10000 --channels 1000 \
#          --rate 2000 --duration 10 --pad 4096 --pad-json --compression
#
# Prints one JSON line: bytes the server wrote (ringcast_bytes_sent_total), compressed
# frames, deliveries, bytes per delivery, server CPU µs per delivery, delivery ratio, and
# for `idle` the server's bytes per connection. The client side decides compression
# (`--compression` offers it; the server has `ws_compression` on by default).
# Environment: RC_BIN (target/release/ringcast), LT_BIN (target/release/loadtest),
# PORT (29200), METRICS_PORT (29201).
set -euo pipefail
cd "$(dirname "$0")/.."
RC="${RC_BIN:-target/release/ringcast}"
LT="${LT_BIN:-target/release/loadtest}"
PORT="${PORT:-29200}"
MPORT="${METRICS_PORT:-29201}"
label=$1
shift
TMP="$(mktemp -d)"
trap 'kill "$P" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/master.key"
chmod 600 "$TMP/master.key"
export RINGCAST_MASTER_KEY_FILE="$TMP/master.key" RINGCAST_MAX_UPGRADES_PER_SECOND=0
"$RC" --data-dir "$TMP/d" project create bench --rate-limit 10000000/s >"$TMP/keys.json"
SK=$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/keys.json")
PK=$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/keys.json")
"$RC" serve --data-dir "$TMP/d" --listen "127.0.0.1:$PORT" --workers 2 \
  --metrics-listen "127.0.0.1:$MPORT" >"$TMP/server.log" 2>&1 &
P=$!
for _ in $(seq 50); do curl -fs "127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
m() { curl -s "127.0.0.1:$MPORT/metrics" | awk -v k="$1" '$1==k{s+=$2} END{printf "%d", s}'; }
b0=$(m ringcast_bytes_sent_total)
c0=$(m ringcast_compressed_frames_total)
out=$("$LT" --quiet --target ringcast --url "http://127.0.0.1:$PORT" --secret-key "$SK" \
  --public-key "$PK" --server-pid "$P" "$@" 2>/dev/null | tail -1)
b1=$(m ringcast_bytes_sent_total)
c1=$(m ringcast_compressed_frames_total)
python3 - "$label" "$b0" "$b1" "$c0" "$c1" "$out" <<'PY'
import json, sys
label, b0, b1, c0, c1, out = sys.argv[1:]
v = json.loads(out)
sent, delivered = int(b1) - int(b0), v.get("received")
print(json.dumps({
    "label": label, "bytes_sent": sent, "compressed_frames": int(c1) - int(c0),
    "delivered": delivered,
    "bytes_per_delivery": round(sent / delivered, 1) if delivered else None,
    "cpu_us_per_delivery": (v.get("cpu") or {}).get("server_cpu_us_per_delivery"),
    "ratio": v.get("delivery_ratio"),
    "rss_per_conn": v.get("server_bytes_per_connection"),
}))
PY
