#!/usr/bin/env bash
# Autobahn|Testsuite conformance of ringcast's WebSocket layer (CI entry point).
#
# Builds examples/ws_echo.rs (the server's own handshake, frame codec and connection
# loop with an echo session), starts it on a free loopback port (it binds :0 and prints
# the address, so there is no port race), runs the shared run.sh against it with the
# default cases (1-7, 9, 10: 301 cases; 12 and 13: permessage-deflate, 216 cases, which
# ws_echo agrees to and answers compressed) and fails on any FAILED or MISSING case.
# Cases 13.3.* and 13.5.* offer a server window of 8 bits: ringcast honours it (frames
# over 256 bytes go plain to such a connection).
#
#   scripts/autobahn.sh [CASES]
#
# Environment: AUTOBAHN_TOOLS (default ../shared/tools/autobahn beside the repo), AUTOBAHN_VENV
# (default /tmp/autobahn-py3-venv; setup.sh is run when it has no wstest), plus
# everything run.sh reads (AUTOBAHN_OUT, AUTOBAHN_TIMEOUT, ...).
# The tools are used in place; they are never copied into this repository.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${AUTOBAHN_TOOLS:-$ROOT/../shared/tools/autobahn}"
VENV="${AUTOBAHN_VENV:-/tmp/autobahn-py3-venv}"
export AUTOBAHN_VENV="$VENV"

if [ ! -x "$VENV/bin/wstest" ]; then
  "$TOOLS/setup.sh" "$VENV"
fi

cd "$ROOT"
cargo build --release --example ws_echo
BIN="$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/examples/ws_echo"

LOG="$(mktemp)"
"$BIN" --listen 127.0.0.1:0 >"$LOG" 2>&1 &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -f "$LOG"; }
trap cleanup EXIT

URL=""
for _ in $(seq 1 100); do
  URL="$(sed -n 's/^ws_echo listening on \(ws:\/\/[^ ]*\).*/\1/p' "$LOG")"
  [ -n "$URL" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG" >&2; echo "autobahn.sh: ws_echo exited" >&2; exit 2; }
  sleep 0.1
done
[ -n "$URL" ] || { echo "autobahn.sh: ws_echo did not report its address" >&2; exit 2; }

if [ $# -eq 0 ]; then
  set -- "1.*,2.*,3.*,4.*,5.*,6.*,7.*,9.*,10.*,12.*,13.*"
fi

SUMMARY="$(mktemp)"
set +e
"$TOOLS/run.sh" "$URL" "$@" | tee "$SUMMARY"
RC=${PIPESTATUS[0]}
set -e
# run.sh already exits non-zero on FAILED/MISSING; also insist on its verdict line, so
# a changed or truncated summary can never pass silently.
if ! grep -Eq '^autobahn: [0-9]+ ok, 0 failed$' "$SUMMARY"; then
  [ "$RC" -eq 0 ] && RC=1
fi
rm -f "$SUMMARY"
exit "$RC"
