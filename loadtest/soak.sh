#!/usr/bin/env bash
# soak.sh: the soak run of issue 5 against a fresh release ringcast.
# Starts `ringcast serve --workers 2` on a free loopback port with a fresh data
# directory, runs `loadtest soak` (default 30 min of connection and subscription
# churn with mixed-size publishes), and writes its JSON line (samples + slopes) to
# loadtest/results/soak-<UTC timestamp>.jsonl (not committed) and to stdout.
#
# Usage:
#   loadtest/soak.sh                       # 1800 s, warm-up 300 s, samples every 10 s
#   SOAK_DURATION=60 SOAK_WARMUP=20 loadtest/soak.sh    # a short trial
#   RC_BIN=/path/ringcast LT_BIN=/path/loadtest loadtest/soak.sh   # prebuilt binaries
#   (any further arguments are passed to `loadtest soak`, e.g. --conns 3000 --rate 300)
#
# Invariants: loopback only; the server is stopped on exit (trap); waits are bounded;
# without RC_BIN/LT_BIN it builds with cargo first.
set -euo pipefail
# Churn reconnects faster than the default node-wide upgrade rate may allow: off here.
export RINGCAST_MAX_UPGRADES_PER_SECOND="${RINGCAST_MAX_UPGRADES_PER_SECOND:-0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${SOAK_DURATION:-1800}"
WARMUP="${SOAK_WARMUP:-300}"
if [ -z "${RC_BIN:-}" ] || [ -z "${LT_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p ringcast -p loadtest >&2)
  RC_BIN="$ROOT/target/release/ringcast"
  LT_BIN="$ROOT/target/release/loadtest"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'; }
PORT="${SOAK_PORT:-$(free_port)}"
TMP="$(mktemp -d /tmp/ringcast-soak.XXXXXX)"
RC_PID=""
cleanup() {
  if [ -n "$RC_PID" ] && kill -0 "$RC_PID" 2>/dev/null; then
    kill -TERM "$RC_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$RC_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$RC_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

"$RC_BIN" --data-dir "$TMP/data" project create soak --rate-limit 10000000/s >"$TMP/keys.json"
SK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
PK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
"$RC_BIN" serve --data-dir "$TMP/data" --listen "127.0.0.1:$PORT" --workers 2 >"$TMP/ringcast.log" 2>&1 &
RC_PID=$!
for _ in $(seq 1 100); do curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/health" && break; sleep 0.1; done
kill -0 "$RC_PID" 2>/dev/null || { echo "soak.sh: ringcast exited" >&2; cat "$TMP/ringcast.log" >&2; exit 1; }
echo "== soak: ringcast pid $RC_PID on 127.0.0.1:$PORT, ${DURATION}s, warm-up ${WARMUP}s" >&2

mkdir -p "$ROOT/loadtest/results"
OUT="$ROOT/loadtest/results/soak-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
rc=0
"$LT_BIN" --url "http://127.0.0.1:$PORT" --secret-key "$SK" --public-key "$PK" \
  --server-pid "$RC_PID" --label soak \
  soak --duration "$DURATION" --warmup "$WARMUP" --sample-every 10 "$@" >"$OUT" || rc=$?
cat "$OUT"
kill -0 "$RC_PID" 2>/dev/null || { echo "soak.sh: ringcast died during the soak" >&2; rc=1; }
echo "== soak: JSON line in $OUT (exit $rc)" >&2
exit "$rc"
