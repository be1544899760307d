#!/usr/bin/env bash
# Sockudo beside ringcast in the Pusher-protocol benchmark (issue 16; docs/design/pusher.md
# section 7, BENCHMARKS.md "Pusher protocol: ringcast beside Sockudo").
#
#   scripts/sockudo.sh env      # print the environment `run` gives Sockudo, one per line
#   scripts/sockudo.sh verify   # check every variable of `env` is read by Sockudo's config
#                               # loader in $SOCKUDO_SRC/crates (a name it does not read would
#                               # be silently ignored and leave a default limit in place)
#   scripts/sockudo.sh run      # exec Sockudo on 127.0.0.1:$SOCKUDO_PORT with that environment
#
# Sockudo's source and binary live outside this repository and are never committed, nor is
# anything that builds them: bring the binary yourself (Sockudo's README, "From Source").
#
# Environment:
#   SOCKUDO_SRC   its source tree, for `verify` (default ../sockudo-src beside the repo)
#   SOCKUDO_BIN   the binary for `run` (default ../sockudo-target/release/sockudo beside the repo)
#   SOCKUDO_PORT  (default 6001)    SOCKUDO_CPUS  CPU list for taskset (default: not pinned)
#   SOCKUDO_APP_ID / SOCKUDO_APP_KEY / SOCKUDO_APP_SECRET  the one app (default 1000001 /
#                 pk_bench / ts_bench; the load generator's --app-id / --public-key / --app-secret)
#
# `run` execs (the caller's `$!` is Sockudo's pid, for --server-pid) from an empty
# directory ($TMPDIR/sockudo-run), so no config/config.toml or config.json is picked up: the defaults plus
# this environment are the whole configuration. Loopback only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PARENT="$(dirname "$ROOT")"
SRC="${SOCKUDO_SRC:-$PARENT/sockudo-src}"
BIN="${SOCKUDO_BIN:-$PARENT/sockudo-target/release/sockudo}"
PORT="${SOCKUDO_PORT:-6001}"

# name=value, one per line. Sockudo's defaults would cap the benchmark (an app registered
# from the environment allows 100 connections and 100 backend events/s; the rate limiter
# allows 20 WebSocket connects and 100 API requests per minute per IP), so each is raised,
# or turned off. LOG_LEVEL (in its .env.example) is not read by the server: RUST_LOG sets
# the filter. WEBSOCKET_MAX_MESSAGES stays at its default (1,000 queued messages per
# connection): it does not bind at the benchmark's rates, and it sizes a queue that is
# allocated whole for every connection (2 x that many slots), so raising it to 100,000
# costs about 13 MB per connection (measured: the machine ran out of memory at 1,900
# connections).
bench_env() {
  cat <<EOF
HOST=127.0.0.1
PORT=$PORT
DEBUG_MODE=false
RUST_LOG=warn
ADAPTER_DRIVER=local
CACHE_DRIVER=memory
QUEUE_DRIVER=memory
APP_MANAGER_DRIVER=memory
RATE_LIMITER_DRIVER=memory
RATE_LIMITER_ENABLED=false
RATE_LIMITER_API_MAX_REQUESTS=1000000000
RATE_LIMITER_WS_MAX_REQUESTS=1000000000
METRICS_ENABLED=false
SOCKUDO_MAX_CONNECTIONS=0
SOCKUDO_DEFAULT_APP_ID=${SOCKUDO_APP_ID:-1000001}
SOCKUDO_DEFAULT_APP_KEY=${SOCKUDO_APP_KEY:-pk_bench}
SOCKUDO_DEFAULT_APP_SECRET=${SOCKUDO_APP_SECRET:-ts_bench}
SOCKUDO_DEFAULT_APP_ENABLED=true
SOCKUDO_DEFAULT_APP_MAX_CONNECTIONS=200000
SOCKUDO_DEFAULT_APP_MAX_BACKEND_EVENTS_PER_SECOND=1000000
SOCKUDO_DEFAULT_APP_MAX_CLIENT_EVENTS_PER_SECOND=1000000
SOCKUDO_DEFAULT_APP_MAX_READ_REQUESTS_PER_SECOND=1000000
SOCKUDO_DEFAULT_APP_MAX_EVENT_BATCH_SIZE=100
EOF
}

case "${1:-}" in
  env)
    bench_env
    ;;
  verify)
    [ -d "$SRC/crates" ] || { echo "sockudo.sh: no source tree at $SRC (set SOCKUDO_SRC)" >&2; exit 1; }
    bad=0
    while IFS='=' read -r name _; do
      # A read of the name as a string literal in non-test Rust source of the server.
      if grep -rqs --include='*.rs' --exclude-dir=tests "\"$name\"" "$SRC/crates"; then
        printf 'read: %s (%s)\n' "$name" \
          "$(grep -rls --include='*.rs' --exclude-dir=tests "\"$name\"" "$SRC/crates" | head -1 | sed "s|^$SRC/||")"
      else
        printf 'NOT READ: %s\n' "$name"; bad=1
      fi
    done < <(bench_env)
    exit "$bad"
    ;;
  run)
    [ -x "$BIN" ] || { echo "sockudo.sh: no binary at $BIN (set SOCKUDO_BIN)" >&2; exit 1; }
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      echo "sockudo.sh: 127.0.0.1:$PORT is already in use (set SOCKUDO_PORT)" >&2; exit 1
    fi
    # One fixed, empty directory (exec leaves no chance to remove a fresh one afterwards).
    DIR="${TMPDIR:-/tmp}/sockudo-run"
    mkdir -p "$DIR"
    [ ! -e "$DIR/config" ] || { echo "sockudo.sh: $DIR/config exists; it would be read as configuration" >&2; exit 1; }
    cd "$DIR"
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    mapfile -t ENVV < <(bench_env)
    if [ -n "${SOCKUDO_CPUS:-}" ]; then
      exec env "${ENVV[@]}" taskset -c "$SOCKUDO_CPUS" "$BIN"
    fi
    exec env "${ENVV[@]}" "$BIN"
    ;;
  *)
    sed -n '2,23p' "$0"
    exit 2
    ;;
esac
