#!/usr/bin/env bash
# run-suite.sh: the standard load-test suite of issue 4, ringcast, nginx+Nchan and the
# uWebSockets peer (issue 21) side by side, or (--smoke) one short fan-out against
# ringcast that fails unless every expected message arrived exactly once, or (--cluster)
# cross-node fan-out on two ringcast nodes sharing a local redis-server (issue 6).
#
# Usage:
#   loadtest/run-suite.sh                 # full suite, 3 repetitions, every target
#   loadtest/run-suite.sh --reps 1        # one repetition
#   loadtest/run-suite.sh --only ringcast # or --only nchan, --only uws, --only "ringcast uws"
#   UWS_BIN=path/to/peer-uws loadtest/run-suite.sh --only uws   # the uWebSockets peer
#                                         #   (ringcast's native protocol on uWS, 2 threads),
#                                         #   built by hand outside this repository as
#                                         #   ../shared/tools/peer-uws/README.md says (epoll
#                                         #   build), never in CI; without UWS_BIN, uws is
#                                         #   skipped with a note. Ringcast-only scenarios
#                                         #   (batch, history, private, presence) skip it.
#   loadtest/run-suite.sh --only-scenario ramp   # one scenario: floor idle-10k idle-19k
#                                         #   publish fanout wide burst ramp batch history private presence
#                                         #   (batch, history: ringcast only, issue 13)
#   (private: ringcast only, fanout and burst on a public channel and on a private- one,
#    alternating, same server process; tokens signed with PyJWT, issue 14)
#   (presence: likewise, a plain channel beside a presence- one; every subscriber is one
#    member, user "lt", so the channel's member list is what a hub keeps, issue 15)
#   (idle-10k-tls: ringcast only, idle-10k over wss:// on a fresh server with TLS on, its
#    certificate made by openssl for the run; the generator trusts exactly its CA, issue 21)
#   RC_BIN=path/to/ringcast loadtest/run-suite.sh ...  # measure another build (e.g. main)
#   loadtest/run-suite.sh --smoke         # CI: 5 s fanout against ringcast, exit 1 unless ratio 1.0
#   loadtest/run-suite.sh --cluster       # 2 nodes (--workers 1 each) + redis: cross-node vs same-node
#                                         #   (--only-scenario history: publish and cross-node fanout
#                                         #   with history on vs off, positions from Redis)
#   loadtest/run-suite.sh --metrics-ab    # ringcast only: publish and fanout with metrics off and on
#                                         #   (on: --metrics-listen and a scrape every second), alternating
#   RC_SERVE_FLAGS="--write-... ..."      # extra flags for every ringcast serve of the run
#   loadtest/run-suite.sh --pusher        # issue 16: ringcast native, ringcast over Pusher and Sockudo
#                                         #   over Pusher, each pinned to SERVER_CPUS (0), the generator
#                                         #   to LT_CPUS (1): idle-10k and fanout (--only-scenario idle-10k,
#                                         #   fanout, or burst); Sockudo from SOCKUDO_BIN (scripts/sockudo.sh); each
#                                         #   run waits for a quiet machine (QUIET_LOAD, QUIET_UNTIL HH:MM)
#
# Results: one JSON line per run in loadtest/results/<UTC timestamp>.jsonl (not committed).
# Invariants: servers listen on loopback only and are stopped on exit (trap); every
# wait is bounded; the machine's 20,000-fd limit per process caps idle at 19,000.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

SMOKE=0
CLUSTER=0
SCENARIO=""
REPS=3
TARGETS="ringcast nchan uws"
RC_PORT="${RC_PORT:-28080}"
NCHAN_PORT="${NCHAN_PORT:-28090}"
UWS_PORT="${UWS_PORT:-28092}"
# The uWebSockets peer's binary (third-party code: built by hand, outside the repository).
UWS_BIN="${UWS_BIN:-}"
RC2_PORT="${RC2_PORT:-28081}"     # --cluster: the second node
REDIS_PORT="${REDIS_PORT:-28379}" # --cluster: its own redis-server
METRICS_PORT="${METRICS_PORT:-28099}" # --metrics-ab: the metrics listener
RC_SERVE_FLAGS="${RC_SERVE_FLAGS:-}"
# The suite measures what the server can take: its node-wide upgrade rate (admission,
# default 2,000/s) would refuse the generators' connect bursts with 1013. Off for every
# ringcast this script starts (an environment variable, so older builds ignore it).
export RINGCAST_MAX_UPGRADES_PER_SECOND="${RINGCAST_MAX_UPGRADES_PER_SECOND:-0}"
METRICS_AB=0
SCRAPER_PID=""
PUSHER=0
SOCKUDO_PID=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --reps) REPS="$2"; shift ;;
    --only) TARGETS="$2"; shift ;;
    --only-scenario) SCENARIO="$2"; shift ;;
    --cluster) CLUSTER=1 ;;
    --metrics-ab) METRICS_AB=1 ;;
    --pusher) PUSHER=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;; # the header comment
    *) echo "run-suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

SCENARIOS="floor idle-10k idle-10k-tls idle-19k publish fanout wide burst ramp batch history private presence"
if [ -n "$SCENARIO" ] && ! echo " $SCENARIOS " | grep -q " $SCENARIO "; then
  echo "run-suite.sh: unknown scenario $SCENARIO (one of: $SCENARIOS)" >&2
  exit 2
fi
want() { [ -z "$SCENARIO" ] || [ "$SCENARIO" = "$1" ]; }

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "== building release binaries" >&2
# nice: the machine is shared; a build's speed changes no figure. ringcast is built only
# when the run starts it (an nchan or uws run needs the generator alone) and RC_BIN does
# not name the binary to measure.
BUILD_PKGS="-p loadtest"
if [ -z "${RC_BIN:-}" ] && { [ "$SMOKE$CLUSTER$METRICS_AB$PUSHER" != 0000 ] || echo " $TARGETS " | grep -q " ringcast "; }; then
  BUILD_PKGS="-p ringcast $BUILD_PKGS"
fi
# shellcheck disable=SC2086
nice -n 19 cargo build --release $BUILD_PKGS >&2
LT="$ROOT/target/release/loadtest"
# RC_BIN: another ringcast binary to measure (e.g. a build of main, for a same-run
# comparison); default the one just built.
RC="${RC_BIN:-$ROOT/target/release/ringcast}"

TMP="$(mktemp -d /tmp/ringcast-suite.XXXXXX)"
RC_PID=""
RC2_PID=""
REDIS_PID=""
NGINX_MASTER=""
UWS_PID=""

stop_ringcast() {
  if [ -n "$RC_PID" ] && kill -0 "$RC_PID" 2>/dev/null; then
    kill -TERM "$RC_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$RC_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$RC_PID" 2>/dev/null || true
  fi
  RC_PID=""
}

stop_nchan() {
  if [ -n "$NGINX_MASTER" ] && kill -0 "$NGINX_MASTER" 2>/dev/null; then
    kill -QUIT "$NGINX_MASTER" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$NGINX_MASTER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NGINX_MASTER" 2>/dev/null || true
  fi
  NGINX_MASTER=""
}

stop_pid() { # PID: TERM, bounded wait (10 s), then KILL
  if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
  fi
}

stop_uws() { # the peer has no graceful drain: SIGTERM ends it at once
  stop_pid "$UWS_PID"
  UWS_PID=""
}

cleanup() {
  stop_pid "$SCRAPER_PID"
  stop_pid "$SOCKUDO_PID"
  stop_pid "${GUARD_PID:-}"
  stop_ringcast
  stop_nchan
  stop_uws
  stop_pid "$RC2_PID"
  stop_pid "$REDIS_PID"
  rm -rf "$TMP"
}
trap cleanup EXIT
# A signal ends the run (the EXIT trap then cleans up) instead of letting it go on.
trap 'exit 130' INT TERM

port_free() { # PORT: refuse to start on a port another process already serves
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "run-suite.sh: 127.0.0.1:$1 is already in use; set RC_PORT / RC2_PORT / NCHAN_PORT / UWS_PORT / REDIS_PORT" >&2
    exit 1
  fi
}

wait_http() { # URL: bounded wait (10 s) for an HTTP answer
  for _ in $(seq 1 100); do
    if curl -s -o /dev/null --max-time 1 "$1"; then return 0; fi
    sleep 0.1
  done
  echo "run-suite.sh: $1 did not answer within 10 s" >&2
  return 1
}

# ringcast: a fresh data directory with a bench project whose quota never binds.
setup_ringcast_keys() {
  mkdir -p "$TMP/rc"
  "$RC" --data-dir "$TMP/rc" project create bench --rate-limit 10000000/s >"$TMP/keys.json"
  SK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
  PK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
  TS="$(sed -n 's/.*"token_secret":"\(ts_[^"]*\)".*/\1/p' "$TMP/keys.json")"
  APP_ID="$(sed -n 's/.*"pusher_app_id":"\([0-9]*\)".*/\1/p' "$TMP/keys.json")"
  if [ -z "$SK" ] || [ -z "$PK" ]; then
    echo "run-suite.sh: could not read keys from: $(cat "$TMP/keys.json")" >&2
    exit 1
  fi
  # A second project with channel history on (scenario `history`); a build without
  # history support (RC_BIN=main) has no --history flag: the scenario is then skipped.
  HSK=""; HPK=""
  if "$RC" --data-dir "$TMP/rc" project create bench-history --rate-limit 10000000/s --history 100/60s >"$TMP/hkeys.json" 2>/dev/null; then
    HSK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/hkeys.json")"
    HPK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/hkeys.json")"
  fi
}

start_ringcast() { # [extra serve flags...]
  stop_ringcast
  port_free "$RC_PORT"
  # shellcheck disable=SC2086
  "$RC" serve --data-dir "$TMP/rc" --listen "127.0.0.1:$RC_PORT" --workers 2 $RC_SERVE_FLAGS "$@" >>"$TMP/ringcast.log" 2>&1 &
  RC_PID=$!
  wait_http "http://127.0.0.1:$RC_PORT/health"
  kill -0 "$RC_PID" 2>/dev/null || { echo "run-suite.sh: ringcast exited:" >&2; tail -20 "$TMP/ringcast.log" >&2; exit 1; }
}

# ringcast with TLS on (scenario idle-10k-tls): a CA and a server certificate for
# 127.0.0.1 made once per run in $TMP/tls (openssl's self-signed certificates are CA
# certificates, which webpki refuses as a server's own); the health check trusts only that CA.
start_ringcast_tls() {
  local d="$TMP/tls"
  if [ ! -f "$d/cert.pem" ]; then
    mkdir -p "$d"
    command -v openssl >/dev/null || { echo "run-suite.sh: idle-10k-tls needs openssl" >&2; exit 1; }
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj "/CN=ringcast suite CA" -keyout "$d/ca.key" -out "$d/ca.pem" 2>>"$d/openssl.log"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=127.0.0.1" -keyout "$d/key.pem" -out "$d/cert.csr" 2>>"$d/openssl.log"
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
    openssl x509 -req -in "$d/cert.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -extfile "$d/ext.cnf" -out "$d/cert.pem" 2>>"$d/openssl.log"
  fi
  stop_ringcast
  port_free "$RC_PORT"
  # shellcheck disable=SC2086
  "$RC" serve --data-dir "$TMP/rc" --listen "127.0.0.1:$RC_PORT" --workers 2 $RC_SERVE_FLAGS \
    --tls-cert "$d/cert.pem" --tls-key "$d/key.pem" >>"$TMP/ringcast.log" 2>&1 &
  RC_PID=$!
  for _ in $(seq 1 100); do
    curl -s -o /dev/null --max-time 1 --cacert "$d/ca.pem" "https://127.0.0.1:$RC_PORT/health" && break
    sleep 0.1
  done
  kill -0 "$RC_PID" 2>/dev/null || { echo "run-suite.sh: ringcast (TLS) exited:" >&2; tail -20 "$TMP/ringcast.log" >&2; exit 1; }
}

ensure_nchan_installed() {
  if [ -f /usr/lib/nginx/modules/ngx_nchan_module.so ] && command -v nginx >/dev/null; then return 0; fi
  if [ "$(id -u)" = 0 ]; then
    echo "== installing nginx + Nchan (Debian packages)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y nginx libnginx-mod-nchan >&2
  else
    echo "run-suite.sh: nginx with Nchan is missing: sudo apt-get install -y nginx libnginx-mod-nchan" >&2
    exit 1
  fi
}

start_nchan() {
  stop_nchan
  port_free "$NCHAN_PORT"
  local dir="$TMP/nchan"
  mkdir -p "$dir/logs" "$dir/tmp"
  sed "s/127.0.0.1:8090/127.0.0.1:$NCHAN_PORT/" "$ROOT/loadtest/nchan/nginx.conf" >"$dir/nginx.conf"
  nginx -p "$dir" -c "$dir/nginx.conf" -g "pid $dir/nginx.pid;"
  wait_http "http://127.0.0.1:$NCHAN_PORT/health"
  NGINX_MASTER="$(cat "$dir/nginx.pid")"
}

# The uWebSockets peer: UWS_BIN, or a note on how to build it. Returns 1 (uws skipped)
# when there is no binary, so that the other targets run as without it.
check_uws() {
  if [ -n "$UWS_BIN" ] && [ -x "$UWS_BIN" ] && [ -f "$UWS_BIN" ]; then
    echo "== uws: $UWS_BIN ($(tr '\n' ' ' 2>/dev/null <"$(dirname "$UWS_BIN")/BUILD_INFO" || echo 'no BUILD_INFO beside it'))" >&2
    return 0
  fi
  echo "run-suite.sh: uws SKIPPED: ${UWS_BIN:+$UWS_BIN is not an executable file; }UWS_BIN must name the" >&2
  echo "  uWebSockets peer's binary. Build it by hand, outside this repository, as" >&2
  echo "  ../shared/tools/peer-uws/README.md says (its build.sh writes" >&2
  echo "  \$PEER_UWS_HOME/build/epoll/peer-uws), then: UWS_BIN=<that path> loadtest/run-suite.sh --only uws" >&2
  return 1
}

# The peer with ringcast's thread count (2 workers on one SO_REUSEPORT port). Its keys
# are fixed (loopback only); PEER_WS_KEY makes it check the upgrade's ?key= as ringcast
# checks its public key.
UWS_SK="sk_uws_bench"
UWS_PK="pk_uws_bench"
start_uws() {
  stop_uws
  port_free "$UWS_PORT"
  PEER_API_KEY="$UWS_SK" PEER_WS_KEY="$UWS_PK" PEER_WORKERS=2 PEER_HOST=127.0.0.1 \
    "$UWS_BIN" "$UWS_PORT" >>"$TMP/uws.log" 2>&1 &
  UWS_PID=$!
  wait_http "http://127.0.0.1:$UWS_PORT/health"
  kill -0 "$UWS_PID" 2>/dev/null || { echo "run-suite.sh: uws exited:" >&2; tail -20 "$TMP/uws.log" >&2; exit 1; }
}

# The --server-pid flags for a target: ringcast's one process; nginx master + workers;
# the peer's one process (its workers are threads).
pid_flags() {
  case "$1" in
    ringcast) echo "--server-pid $RC_PID" ;;
    uws) echo "--server-pid $UWS_PID" ;;
    *)
      local p flags="--server-pid $NGINX_MASTER"
      for p in $(pgrep -P "$NGINX_MASTER"); do flags="$flags --server-pid $p"; done
      echo "$flags"
      ;;
  esac
}

target_flags() {
  case "$1" in
    ringcast) echo "--target ringcast --url http://127.0.0.1:$RC_PORT --secret-key $SK --public-key $PK" ;;
    # ringcast's native protocol; the generator's `uws` kind only names it in the results.
    uws) echo "--target uws --url http://127.0.0.1:$UWS_PORT --secret-key $UWS_SK --public-key $UWS_PK" ;;
    *) echo "--target nchan --url http://127.0.0.1:$NCHAN_PORT" ;;
  esac
}

restart() {
  case "$1" in
    ringcast) start_ringcast ;;
    uws) start_uws ;;
    *) start_nchan ;;
  esac
}

if [ "$SMOKE" = 1 ]; then
  setup_ringcast_keys
  start_ringcast
  echo "== smoke: 5 s fanout against ringcast" >&2
  # shellcheck disable=SC2046
  OUT="$("$LT" $(target_flags ringcast) $(pid_flags ringcast) --label smoke \
    fanout --subs 200 --channels 4 --rate 50 --duration 5 --drain 5)" || {
    echo "$OUT"
    echo "run-suite.sh: smoke FAILED (delivery ratio below 1.0, duplicates, or no publishes)" >&2
    tail -20 "$TMP/ringcast.log" >&2 || true
    exit 1
  }
  echo "$OUT"
  echo "== smoke ok" >&2
  exit 0
fi

mkdir -p "$ROOT/loadtest/results"
RESULTS="$ROOT/loadtest/results/$(date -u +%Y%m%dT%H%M%SZ).jsonl"
echo "== results: $RESULTS" >&2

# --cluster: two ringcast nodes (--workers 1 each) on one local redis-server; fanout
# with subscribers on node 1 and publishers on node 2 (cross-node), then both on node 1
# (same node, same cluster) for comparison, at 100/s and at CLUSTER_HIGH_RATE/s,
# and a ramp of each.
if [ "$CLUSTER" = 1 ]; then
  command -v redis-server >/dev/null || { echo "run-suite.sh: redis-server is missing: apt-get install -y redis-server" >&2; exit 1; }
  HIGH="${CLUSTER_HIGH_RATE:-200}"
  port_free "$REDIS_PORT"; port_free "$RC_PORT"; port_free "$RC2_PORT"
  mkdir -p "$TMP/redis" "$TMP/n1" "$TMP/n2"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$TMP/redis" >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  redis-cli -p "$REDIS_PORT" ping | grep -q PONG || { echo "run-suite.sh: redis-server did not start" >&2; cat "$TMP/redis.log" >&2; exit 1; }
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  # Cluster mode needs one master key file (seals token secrets) for every node and the CLI.
  openssl rand -hex 32 >"$TMP/master.key" 2>/dev/null || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/master.key"
  chmod 600 "$TMP/master.key"
  export RINGCAST_MASTER_KEY_FILE="$TMP/master.key"
  "$RC" --redis "$REDIS_URL" project create bench --rate-limit 10000000/s >"$TMP/keys.json"
  SK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
  PK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/keys.json")"
  [ -n "$SK" ] && [ -n "$PK" ] || { echo "run-suite.sh: no keys from: $(cat "$TMP/keys.json")" >&2; exit 1; }
  # Scenario `history`: a second project whose positions come from Redis (issue 13).
  "$RC" --redis "$REDIS_URL" project create bench-history --rate-limit 10000000/s --history 100/600s >"$TMP/hkeys.json"
  HSK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/hkeys.json")"
  HPK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/hkeys.json")"
  "$RC" --redis "$REDIS_URL" serve --data-dir "$TMP/n1" --listen "127.0.0.1:$RC_PORT" --workers 1 >>"$TMP/node1.log" 2>&1 &
  RC_PID=$!
  "$RC" --redis "$REDIS_URL" serve --data-dir "$TMP/n2" --listen "127.0.0.1:$RC2_PORT" --workers 1 >>"$TMP/node2.log" 2>&1 &
  RC2_PID=$!
  wait_http "http://127.0.0.1:$RC_PORT/health"
  wait_http "http://127.0.0.1:$RC2_PORT/health"
  N1="http://127.0.0.1:$RC_PORT"
  N2="http://127.0.0.1:$RC2_PORT"
  crun() { # NAME REP PUBLISH_URL -- loadtest mode args...
    local name="$1" rep="$2" purl="$3"
    shift 4
    echo "== cluster $name rep $rep: loadtest --url $N1 --publish-url $purl $*" >&2
    if ! "$LT" --quiet --target ringcast --url "$N1" --publish-url "$purl" \
        --secret-key "${CSK:-$SK}" --public-key "${CPK:-$PK}" --server-pid "$RC_PID" --server-pid "$RC2_PID" \
        --label "cluster-$name/r$rep" "$@" >>"$RESULTS"; then
      echo "   (cluster $name rep $rep reported a failure; see its JSON line)" >&2
    fi
    sleep 2
  }
  for rep in $(seq 1 "$REPS"); do
    if want fanout; then
      for r in 100 "$HIGH"; do
        crun "cross-$r" "$rep" "$N2" -- fanout --subs 1000 --channels 1 --rate "$r" --duration 10
        crun "same-$r" "$rep" "$N1" -- fanout --subs 1000 --channels 1 --rate "$r" --duration 10
      done
    fi
    # History on (offsets from a Redis script) vs off, same nodes, alternating order.
    if want history; then
      order="off on"
      [ $((rep % 2)) = 0 ] && order="on off"
      for v in $order; do
        if [ "$v" = on ]; then
          CSK="$HSK" CPK="$HPK" crun "history-on-publish" "$rep" "$N2" -- publish --conns 64 --duration 10
          CSK="$HSK" CPK="$HPK" crun "history-on-cross-$HIGH" "$rep" "$N2" -- fanout --subs 1000 --channels 1 --rate "$HIGH" --duration 10
        else
          crun "history-off-publish" "$rep" "$N2" -- publish --conns 64 --duration 10
          crun "history-off-cross-$HIGH" "$rep" "$N2" -- fanout --subs 1000 --channels 1 --rate "$HIGH" --duration 10
        fi
      done
    fi
    if want ramp; then
      crun cross-ramp "$rep" "$N2" -- ramp --subs 1000 --channels 1 --start-rate 50 --step-duration 5 --max-steps 10
      crun same-ramp "$rep" "$N1" -- ramp --subs 1000 --channels 1 --start-rate 50 --step-duration 5 --max-steps 10
    fi
  done
  kill -0 "$RC_PID" 2>/dev/null && kill -0 "$RC2_PID" 2>/dev/null || { echo "run-suite.sh: a node exited" >&2; tail -5 "$TMP"/node*.log >&2; }
  TARGETS=""
  REPS=0
fi

# --metrics-ab: the same publish and fanout scenarios with metrics off and on, in
# alternating order within each repetition so that drift of the shared machine hits both.
if [ "$METRICS_AB" = 1 ]; then
  setup_ringcast_keys
  ab_run() { # VARIANT SCENARIO REP -- loadtest mode args...
    local v="$1" name="$2" rep="$3"
    shift 4
    echo "== metrics-$v $name rep $rep: loadtest $*" >&2
    # shellcheck disable=SC2046
    if ! "$LT" --quiet --source-ips 4 $(target_flags ringcast) $(pid_flags ringcast) \
        --label "metrics-$v/$name/r$rep" "$@" >>"$RESULTS"; then
      echo "   (metrics-$v $name rep $rep reported a failure; see its JSON line)" >&2
    fi
    sleep 2
  }
  for rep in $(seq 1 "$REPS"); do
    order="off on"
    [ $((rep % 2)) = 0 ] && order="on off"
    for v in $order; do
      if [ "$v" = on ]; then
        port_free "$METRICS_PORT"
        start_ringcast --metrics-listen "127.0.0.1:$METRICS_PORT"
        # A scrape every second (Prometheus scrapes every 10-15 s: this is harsher).
        ( while curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$METRICS_PORT/metrics"; do sleep 1; done ) &
        SCRAPER_PID=$!
      else
        start_ringcast
      fi
      if want publish; then ab_run "$v" publish "$rep" -- publish --conns 64 --duration 10; fi
      if want fanout; then ab_run "$v" fanout "$rep" -- fanout --subs 10000 --channels 1 --rate 4 --duration 10; fi
      if want burst; then ab_run "$v" burst "$rep" -- fanout --subs 100 --channels 1 --rate 1000 --duration 10; fi
      stop_pid "$SCRAPER_PID"
      SCRAPER_PID=""
      stop_ringcast
    done
  done
  TARGETS=""
  REPS=0
fi

# --pusher (issue 16): the same load generator against ringcast over its native protocol,
# ringcast over the Pusher protocol (/app/{key}) and Sockudo over the Pusher protocol, one
# after the other in one run. Every server is pinned to SERVER_CPUS and started fresh for
# each measured run; the generator is pinned to LT_CPUS. ringcast's Pusher REST API is not
# on every branch: PUSHER_RC_PUBLISH=native (default) publishes to ringcast's /app/{key}
# subscribers through /api/v1/publish; Sockudo always gets signed Pusher REST publishes.
# Before each measured run the suite waits (polling every 20 s) until no rustc/cargo runs
# outside this repository and the 1-minute load average is below QUIET_LOAD (1.0); past
# QUIET_UNTIL (HH:MM, machine clock; unset: wait forever) it stops measuring. Each JSON
# line gains variant, server, publish_api and the load average / other builds seen. A
# server whose RSS passes SERVER_RSS_LIMIT_MB (6144) is killed (the machine is shared).
if [ "$PUSHER" = 1 ]; then
  SERVER_CPUS="${SERVER_CPUS:-0}"
  LT_CPUS="${LT_CPUS:-1}"
  QUIET_LOAD="${QUIET_LOAD:-1.0}"
  QUIET_UNTIL="${QUIET_UNTIL:-}"
  PUSHER_SUBS="${PUSHER_SUBS:-10000}"
  PUSHER_RATE="${PUSHER_RATE:-4}"
  PUSHER_DURATION="${PUSHER_DURATION:-20}"
  PUSHER_RC_PUBLISH="${PUSHER_RC_PUBLISH:-native}"
  SERVER_RSS_LIMIT_MB="${SERVER_RSS_LIMIT_MB:-6144}"
  PUSHER_NOTE="${PUSHER_NOTE:-}" # appended to each label and kept as "note" (e.g. a changed server setting)
  SOCKUDO_PORT="${SOCKUDO_PORT:-6001}"
  export SOCKUDO_PORT SOCKUDO_APP_ID=1000001 SOCKUDO_APP_KEY=pk_bench SOCKUDO_APP_SECRET=ts_bench
  SOCKUDO_BIN="${SOCKUDO_BIN:-$(dirname "$ROOT")/sockudo-target/release/sockudo}"
  export SOCKUDO_BIN
  VARIANTS="${PUSHER_VARIANTS:-rc-native rc-pusher sockudo-pusher}"
  if ! [ -x "$SOCKUDO_BIN" ]; then
    echo "run-suite.sh: no Sockudo binary at $SOCKUDO_BIN: sockudo-pusher is skipped" >&2
    VARIANTS="$(echo "$VARIANTS" | sed 's/sockudo-pusher//')"
  fi
  deadline=""
  [ -n "$QUIET_UNTIL" ] && deadline="$(date -d "$QUIET_UNTIL" +%s)"
  other_builds() { # rustc/cargo processes whose working directory is outside this repository
    local p cwd
    for p in $(pgrep -x 'rustc|cargo' || true); do
      cwd="$(readlink "/proc/$p/cwd" 2>/dev/null || true)"
      case "$cwd" in "$ROOT"|"$ROOT"/*) ;; *) printf '%s:%s ' "$p" "$cwd" ;; esac
    done
  }
  wait_quiet() { # returns 1 once past QUIET_UNTIL
    local load busy
    while :; do
      load="$(cut -d' ' -f1 /proc/loadavg)"
      busy="$(other_builds)"
      if [ -z "$busy" ] && awk -v l="$load" -v q="$QUIET_LOAD" 'BEGIN { exit !(l < q) }'; then
        LOAD_BEFORE="$load"
        return 0
      fi
      if [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ]; then
        echo "== $(date +%H:%M:%S) past QUIET_UNTIL $QUIET_UNTIL, still not quiet (load $load${busy:+; builds: $busy}): no more runs" >&2
        return 1
      fi
      echo "== $(date +%H:%M:%S) waiting for a quiet machine: load $load${busy:+; builds: $busy}" >&2
      sleep 20
    done
  }
  start_server() { # VARIANT: a fresh server pinned to SERVER_CPUS; sets SERVER_PID, SERVER_FLAGS
    case "$1" in
      rc-*)
        stop_ringcast
        port_free "$RC_PORT"
        # shellcheck disable=SC2086
        taskset -c "$SERVER_CPUS" "$RC" serve --data-dir "$TMP/rc" --listen "127.0.0.1:$RC_PORT" \
          --workers 1 $RC_SERVE_FLAGS >>"$TMP/ringcast.log" 2>&1 &
        RC_PID=$!
        wait_http "http://127.0.0.1:$RC_PORT/health"
        SERVER_PID="$RC_PID"
        if [ "$1" = rc-native ]; then
          SERVER_FLAGS="--target ringcast --url http://127.0.0.1:$RC_PORT --secret-key $SK --public-key $PK"
        else
          SERVER_FLAGS="--target pusher --url http://127.0.0.1:$RC_PORT --public-key $PK --secret-key $SK --publish $PUSHER_RC_PUBLISH"
          [ -z "$APP_ID" ] || SERVER_FLAGS="$SERVER_FLAGS --app-id $APP_ID --app-secret $TS"
        fi
        ;;
      sockudo-pusher)
        stop_pid "$SOCKUDO_PID"
        SOCKUDO_CPUS="$SERVER_CPUS" "$ROOT/scripts/sockudo.sh" run >>"$TMP/sockudo.log" 2>&1 &
        SOCKUDO_PID=$!
        wait_http "http://127.0.0.1:$SOCKUDO_PORT/up"
        SERVER_PID="$SOCKUDO_PID"
        SERVER_FLAGS="--target pusher --url http://127.0.0.1:$SOCKUDO_PORT --public-key $SOCKUDO_APP_KEY --app-id $SOCKUDO_APP_ID --app-secret $SOCKUDO_APP_SECRET --publish pusher"
        ;;
    esac
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "run-suite.sh: $1 exited" >&2; tail -20 "$TMP"/*.log >&2; exit 1; }
  }
  stop_server() {
    stop_ringcast
    stop_pid "$SOCKUDO_PID"
    SOCKUDO_PID=""
  }
  prun() { # VARIANT SCENARIO REP -- loadtest mode args...
    local v="$1" name="$2" rep="$3" out rc=0
    shift 4
    start_server "$v"
    sleep 1
    echo "== $(date +%H:%M:%S) pusher $v $name rep $rep (load $LOAD_BEFORE): loadtest $SERVER_FLAGS $*" >&2
    # A guard for the shared machine: a server past SERVER_RSS_LIMIT_MB is killed (the run
    # then reports its connections closed) before the kernel's OOM killer picks anything.
    ( while kill -0 "$SERVER_PID" 2>/dev/null; do
        rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$SERVER_PID/status" 2>/dev/null || echo 0)"
        if [ "${rss:-0}" -gt $((SERVER_RSS_LIMIT_MB * 1024)) ]; then
          echo "== $v: RSS ${rss} kB over SERVER_RSS_LIMIT_MB=$SERVER_RSS_LIMIT_MB: killed" >&2
          kill -KILL "$SERVER_PID"
        fi
        sleep 0.5
      done ) &
    GUARD_PID=$!
    # shellcheck disable=SC2086
    out="$(taskset -c "$LT_CPUS" "$LT" --quiet $SERVER_FLAGS --server-pid "$SERVER_PID" \
      --label "pusher/$v$PUSHER_NOTE/$name/r$rep" "$@")" || rc=$?
    [ "$rc" = 0 ] || echo "   (pusher $v $name rep $rep reported a failure; see its JSON line)" >&2
    stop_server
    stop_pid "$GUARD_PID"
    [ -n "$out" ] || return 0
    python3 - "$out" "$v" "$LOAD_BEFORE" "$(cut -d' ' -f1 /proc/loadavg)" "$(other_builds)" \
      "$SERVER_CPUS" "$LT_CPUS" "$PUSHER_NOTE" <<'PYEOF' >>"$RESULTS"
import json, sys
v = json.loads(sys.argv[1])
v["variant"] = sys.argv[2]
v["server"] = "sockudo" if sys.argv[2].startswith("sockudo") else "ringcast"
v["load1_before"] = float(sys.argv[3])
v["load1_after"] = float(sys.argv[4])
v["other_builds_after"] = sys.argv[5].strip()
v["server_cpus"] = sys.argv[6]
v["generator_cpus"] = sys.argv[7]
if sys.argv[8]:
    v["note"] = sys.argv[8]
print(json.dumps(v))
PYEOF
    sleep 2
  }
  setup_ringcast_keys
  [ -n "$APP_ID" ] || echo "run-suite.sh: no pusher_app_id in the project (a build without Pusher?)" >&2
  stopped=0
  for rep in $(seq 1 "$REPS"); do
    # Rotate the order each repetition, so drift of the machine is spread over variants.
    order="$VARIANTS"
    for _ in $(seq 2 "$rep"); do order="$(echo $order | awk '{ for (i = 2; i <= NF; i++) printf "%s ", $i; print $1 }')"; done
    for v in $order; do
      if want idle-10k; then
        wait_quiet || { stopped=1; break 2; }
        prun "$v" idle-10k "$rep" -- idle --conns 10000 --hold 5
      fi
      if want fanout; then
        wait_quiet || { stopped=1; break 2; }
        prun "$v" fanout "$rep" -- fanout --subs "$PUSHER_SUBS" --channels 1 --rate "$PUSHER_RATE" --duration "$PUSHER_DURATION"
      fi
      # Only when asked for (--only-scenario burst): few subscribers, many publishes, so
      # the publish path weighs in (each variant's own: see PUSHER_RC_PUBLISH).
      if [ "$SCENARIO" = burst ]; then
        wait_quiet || { stopped=1; break 2; }
        prun "$v" burst "$rep" -- fanout --subs 100 --channels 1 --rate 1000 --duration "$PUSHER_DURATION"
      fi
    done
  done
  [ "$stopped" = 0 ] || echo "== stopped early (machine not quiet by $QUIET_UNTIL)" >&2
  python3 - "$RESULTS" <<'PYEOF' >&2 || true
import json, sys
for line in open(sys.argv[1]):
    v = json.loads(line)
    cpu = v.get("cpu", {})
    if v["mode"] == "idle":
        print(f'{v["label"]:36} open={v.get("connections_open")} bytes/conn={v.get("server_bytes_per_connection")} load={v["load1_before"]}')
    else:
        print(f'{v["label"]:36} ratio={v["delivery_ratio"]} dup={v["duplicates"]} deliv/s={v["deliveries_per_s"]} '
              f'p50={v["latency"]["p50_us"]}us p99={v["latency"]["p99_us"]}us cpu_us/delivery={cpu.get("server_cpu_us_per_delivery")} load={v["load1_before"]}')
PYEOF
  echo "== done: $RESULTS" >&2
  exit 0
fi

for t in $TARGETS; do
  case "$t" in
    ringcast) setup_ringcast_keys ;;
    nchan) ensure_nchan_installed ;;
    uws) check_uws || TARGETS="$(echo " $TARGETS " | sed 's/ uws / /')" ;;
    *) echo "run-suite.sh: unknown target $t" >&2; exit 2 ;;
  esac
done

run() { # TARGET SCENARIO REP -- loadtest mode args...
  local t="$1" name="$2" rep="$3"
  shift 4
  echo "== $t $name rep $rep: loadtest $*" >&2
  # shellcheck disable=SC2046
  if ! "$LT" --quiet --source-ips 4 $(target_flags "$t") $(pid_flags "$t") \
      --label "$name/r$rep" "$@" >>"$RESULTS"; then
    echo "   ($t $name rep $rep reported a failure; see its JSON line)" >&2
  fi
  sleep 2 # let TIME_WAIT and server-side cleanup settle between scenarios
}

for rep in $(seq 1 "$REPS"); do
  if want floor; then
    echo "== floor rep $rep" >&2
    # The floor at the socket counts of the scenarios it is compared with: 100 (burst)
    # and 9,900 (fanout/wide; 10k needs two fds each in one process, over the limit).
    # Kernel TCP cost per frame grows with the socket count (colder caches, bigger
    # tables), so a fan-out is compared with the floor of the same size.
    "$LT" --label "floor-100/r$rep" floor --sockets 100 --duration 3 >>"$RESULTS" || true
    "$LT" --label "floor-9900/r$rep" floor --sockets 9900 --duration 3 >>"$RESULTS" || true
    # The same floor at the rate and shape of each fan-out scenario: rounds of one frame
    # to the next K sockets (a publish to K subscribers), R rounds/s, the sender asleep
    # between rounds, so the reader sleeps in epoll and each burst pays its wake-up, as
    # the scenario's does. The reader is a child process with 2 epoll threads, like the
    # scenario's subscribers (the generator's default --threads 2). Compare fanout with
    # floor-fanout-rate, wide with floor-wide-rate, burst with floor-burst-rate.
    FLOOR_RATE="--reader process --reader-threads 2 --variants write,uring"
    # shellcheck disable=SC2086
    "$LT" --label "floor-fanout-rate/r$rep" floor --sockets 9900 --rounds-per-s 4 --per-round 9900 \
      --duration 10 $FLOOR_RATE >>"$RESULTS" || true
    # shellcheck disable=SC2086
    "$LT" --label "floor-wide-rate/r$rep" floor --sockets 9900 --rounds-per-s 2000 --per-round 10 \
      --duration 3 $FLOOR_RATE >>"$RESULTS" || true
    # shellcheck disable=SC2086
    "$LT" --label "floor-burst-rate/r$rep" floor --sockets 100 --rounds-per-s 1000 --per-round 100 \
      --duration 3 $FLOOR_RATE >>"$RESULTS" || true
  fi
  for t in $TARGETS; do
    # Idle first on a fresh process, so RSS deltas are not hidden by memory an
    # earlier scenario left in the allocator.
    if want idle-10k; then
      restart "$t"
      run "$t" idle-10k "$rep" -- idle --conns 10000 --hold 5
    fi
    if want idle-19k; then
      restart "$t"
      run "$t" idle-19k "$rep" -- idle --conns 19000 --hold 5
    fi
    # The same idle connections over wss:// (issue 21), on a fresh TLS server.
    if want idle-10k-tls && [ "$t" = ringcast ]; then
      start_ringcast_tls
      echo "== $t idle-10k-tls rep $rep: loadtest --url wss://127.0.0.1:$RC_PORT idle --conns 10000 --hold 5" >&2
      if ! "$LT" --quiet --source-ips 4 --target ringcast --url "wss://127.0.0.1:$RC_PORT" \
          --ca-file "$TMP/tls/ca.pem" --secret-key "$SK" --public-key "$PK" --server-pid "$RC_PID" \
          --label "idle-10k-tls/r$rep" idle --conns 10000 --hold 5 >>"$RESULTS"; then
        echo "   ($t idle-10k-tls rep $rep reported a failure; see its JSON line)" >&2
      fi
      sleep 2
    fi
    restart "$t"
    if want publish; then run "$t" publish "$rep" -- publish --conns 64 --duration 10; fi
    if want fanout; then run "$t" fanout "$rep" -- fanout --subs 10000 --channels 1 --rate 4 --duration 10; fi
    if want wide; then run "$t" wide "$rep" -- fanout --subs 10000 --channels 1000 --rate 2000 --duration 10; fi
    if want burst; then run "$t" burst "$rep" -- fanout --subs 100 --channels 1 --rate 1000 --duration 10; fi
    # Rate doubled from 2/s, then bisected, 5 s steps, until p99 > 250 ms or a loss.
    if want ramp; then run "$t" ramp "$rep" -- ramp --subs 10000 --channels 1 --start-rate 2 --step-duration 5 --drain 3 --max-steps 12; fi
    # Batch publish (ringcast only; Nchan has none): single publishes and batches of 100
    # of the same ~110-byte messages back to back, server CPU per message compared
    # within the run; then batches of 100 to 10k subscribers on 2 channels from one
    # connection (answers in order), where any loss, duplicate or reorder is a failure.
    if want batch && [ "$t" = ringcast ]; then
      run "$t" batch-single "$rep" -- publish --conns 64 --duration 10 --pad 30
      run "$t" batch-100 "$rep" -- publish --conns 8 --duration 10 --pad 30 --batch 100
      run "$t" batch-fanout "$rep" -- fanout --subs 10000 --channels 2 --rate 40 --duration 10 --batch 100 --pub-conns 1 --pad 30 --drain 20
    fi
    # History on (issue 13): the same publish and fan-out against a project that keeps
    # 100 messages per channel for 60 s, to set beside publish/fanout (history off).
    if want history && [ "$t" = ringcast ] && [ -n "$HSK" ]; then
      SK="$HSK" PK="$HPK" run "$t" history-publish "$rep" -- publish --conns 64 --duration 10
      SK="$HSK" PK="$HPK" run "$t" history-fanout "$rep" -- fanout --subs 10000 --channels 1 --rate 4 --duration 10
    fi
    # Private channels beside public ones, same process, alternating: a token per run
    # names its one channel (fixed tag), so the private run differs only in the token.
    if want private && [ "$t" = ringcast ]; then
      for shape in "fanout:--subs 10000 --channels 1 --rate 4" "burst:--subs 100 --channels 1 --rate 1000"; do
        name="${shape%%:*}"; args="${shape#*:}"
        tag="p${rep}${name}$$"
        token="$(python3 -c 'import jwt,sys,time; print(jwt.encode({"channel": sys.argv[2], "exp": int(time.time()) + 3600}, sys.argv[1], algorithm="HS256"))' "$TS" "private-lt${tag}c0")"
        # shellcheck disable=SC2086
        run "$t" "$name-public" "$rep" -- --tag "u$tag" fanout $args --duration 10
        # shellcheck disable=SC2086
        run "$t" "$name-private" "$rep" -- --channel-prefix private-lt --tag "$tag" --token "$token" fanout $args --duration 10
      done
    fi
    # Presence channels beside plain ones, same process, alternating: the subscribers of
    # the presence run are members (one user, as many tabs), so each subscribe passes
    # through the presence hub; the fan-out itself is the same registry walk.
    if want presence && [ "$t" = ringcast ]; then
      for shape in "fanout:--subs 10000 --channels 1 --rate 4" "burst:--subs 100 --channels 1 --rate 1000"; do
        name="${shape%%:*}"; args="${shape#*:}"
        tag="m${rep}${name}$$"
        token="$(python3 -c 'import jwt,sys,time; print(jwt.encode({"channel": sys.argv[2], "exp": int(time.time()) + 3600, "sub": "lt"}, sys.argv[1], algorithm="HS256"))' "$TS" "presence-lt${tag}c0")"
        # shellcheck disable=SC2086
        run "$t" "$name-plain" "$rep" -- --tag "u$tag" fanout $args --duration 10
        # shellcheck disable=SC2086
        run "$t" "$name-presence" "$rep" -- --channel-prefix presence-lt --tag "$tag" --token "$token" fanout $args --duration 10
      done
    fi
  done
done
stop_ringcast
stop_nchan
stop_uws

# Nothing ran (e.g. --only uws without UWS_BIN, or a ringcast-only scenario for nchan).
if ! [ -s "$RESULTS" ]; then
  echo "== done: no runs" >&2
  exit 0
fi
echo "== done: $(wc -l <"$RESULTS") runs in $RESULTS" >&2
# A compact summary, one line per run, from the JSON lines.
python3 - "$RESULTS" <<'EOF' >&2 || true
import json, sys
for line in open(sys.argv[1]):
    v = json.loads(line)
    cpu = v.get("cpu", {})
    if v["mode"] == "floor":
        # A paced floor (rounds_per_s set) also shows the rate it held.
        print(f'{v.get("label",""):14} floor   ' + "  ".join(
            f'{x["variant"]}={x.get("sender_cpu_us_per_frame")}us'
            + (f' ({x.get("frames_per_s")}/{x.get("target_frames_per_s")} frames/s)'
               if v.get("params", {}).get("rounds_per_s") else "")
            for x in v["variants"]))
    elif v["mode"] == "idle":
        print(f'{v.get("label",""):14} {v["target"]:8} bytes/conn={v.get("server_bytes_per_connection")}')
    elif v["mode"] == "ramp":
        b = v.get("best") or {}
        lf = v.get("lowest_failure") or {}
        print(f'{v.get("label",""):14} {v["target"]:8} ramp best={v.get("best_rate")}/s deliv/s={v.get("sustained_deliveries_per_s")} '
              f'p99={b.get("p99_ms")}ms cpu%={b.get("server_cpu_pct")} first_fail={lf.get("rate")} ({lf.get("why")})')
    elif v["mode"] == "publish":
        print(f'{v.get("label",""):14} {v["target"]:8} req/s={v["requests_per_s"]} msgs/s={v["accepted_per_s"]} '
              f'cpu_us/publish={cpu.get("server_cpu_us_per_accepted_publish")}')
    else:
        lat = v["latency"]
        print(f'{v.get("label",""):14} {v["target"]:8} ratio={v["delivery_ratio"]} dup={v["duplicates"]} reord={v.get("reordered")} deliv/s={v["deliveries_per_s"]} '
              f'p50={lat["p50_us"]}us p99={lat["p99_us"]}us cpu_us/delivery={cpu.get("server_cpu_us_per_delivery")}')
EOF
