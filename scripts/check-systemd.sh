#!/usr/bin/env bash
# Check deploy/ringcast.service with `systemd-analyze verify` (CI runs this).
#
#   bash scripts/check-systemd.sh [BINARY]
#
# verify needs the ExecStart binary to exist, so a copy of the unit points at BINARY
# (default target/debug/ringcast, built if missing). Any message from verify is a
# failure: systemd only warns about an unknown or misspelt directive and goes on.
# Without systemd-analyze (a container without systemd) the package is installed with
# apt-get when possible; if it still cannot run, the check is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
UNIT=deploy/ringcast.service
BIN="${1:-target/debug/ringcast}"

if ! command -v systemd-analyze >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "installing systemd (for systemd-analyze)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIPPED: systemd-analyze is not available here; $UNIT was not verified"
  exit 0
fi
[ -x "$BIN" ] || cargo build --bin ringcast
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
sed "s#^ExecStart=/usr/local/bin/ringcast #ExecStart=$BIN #" "$UNIT" >"$TMP/ringcast.service"
grep -q "^ExecStart=$BIN " "$TMP/ringcast.service" || { echo "ExecStart of $UNIT is not /usr/local/bin/ringcast ..." >&2; exit 1; }
set +e
OUT="$(systemd-analyze verify "$TMP/ringcast.service" 2>&1)"
RC=$?
set -e
if [ "$RC" -ne 0 ] || [ -n "$OUT" ]; then
  echo "systemd-analyze verify $UNIT failed (exit $RC):" >&2
  echo "$OUT" >&2
  exit 1
fi
echo "systemd-analyze verify: $UNIT ok"
