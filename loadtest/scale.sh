#!/usr/bin/env bash
# scale.sh: the `scale` scenario of issue 26, by hand only (never in CI).
#
# N ringcast nodes in cluster mode on one local redis-server, each one process with
# --workers 1 (5 nodes on a 2-core machine: more workers would only add threads fighting
# for the same two cores). On every node, GENS_PER_NODE generator processes (`loadtest
# fanout`), each holding < 19,000 WebSocket subscribers (the 20,000 open-files limit per
# process applies to the generator too), every subscriber on its generator's channel;
# each generator publishes through the NEXT node, so every delivery takes the Redis hop.
#
# Merging (done by the python step at the end, from one JSON line per generator):
# deliveries, expected and duplicates are summed, so the delivery ratio is the fleet's;
# latency is reported per generator and as the MAX p50/p99 over generators (not a merged
# histogram: a conservative figure); server CPU is read by this script from /proc for
# every node and for redis-server over the whole generator run (connect phase included,
# so CPU per delivery is an upper bound), and RSS per node once all are connected.
#
# Usage:
#   loadtest/scale.sh                       # 3 nodes x 1 generator x 1,000 subs (smoke size)
#   NODES=5 SUBS=19900 GENS_PER_NODE=2 RATE=2 DURATION=20 loadtest/scale.sh   # full size
# Environment: RC_BIN (default target/release/ringcast), LT_BIN (default
# target/release/loadtest), NODES, SUBS (per node), GENS_PER_NODE, RATE (publishes/s per
# generator), DURATION (s), BASE_PORT (28400), REDIS_PORT (28399), RESULTS (a file the
# generators' JSON lines are appended to), KEEP_TMP=1 (keep the node and redis logs),
# RINGCAST_MAX_UPGRADES_PER_SECOND (default here 0 = off, for the connect phase).
set -euo pipefail
cd "$(dirname "$0")/.."
RC="${RC_BIN:-target/release/ringcast}"
LT="${LT_BIN:-target/release/loadtest}"
NODES="${NODES:-3}"
SUBS="${SUBS:-1000}"
GENS="${GENS_PER_NODE:-1}"
RATE="${RATE:-2}"
DURATION="${DURATION:-10}"
BASE_PORT="${BASE_PORT:-28400}"
REDIS_PORT="${REDIS_PORT:-28399}"
export RINGCAST_MAX_UPGRADES_PER_SECOND="${RINGCAST_MAX_UPGRADES_PER_SECOND:-0}"
[ -x "$RC" ] || { echo "scale.sh: no ringcast binary at $RC (cargo build --release, or RC_BIN)" >&2; exit 1; }
[ -x "$LT" ] || { echo "scale.sh: no loadtest binary at $LT (cargo build --release -p loadtest, or LT_BIN)" >&2; exit 1; }
PER_GEN=$(( SUBS / GENS ))
[ "$PER_GEN" -lt 19000 ] || { echo "scale.sh: $PER_GEN subscribers per generator: raise GENS_PER_NODE (< 19,000 each)" >&2; exit 1; }

TMP="$(mktemp -d)"
RESULTS="${RESULTS:-/dev/null}"
PIDS=()
cleanup() {
  # Newest first: generators, then nodes, then redis (nodes never see Redis vanish).
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP_TMP:-0}" = 1 ] && echo "scale.sh: logs kept in $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=loadtest/lib-cluster.sh
. loadtest/lib-cluster.sh
cluster_redis
cluster_project scale --rate-limit 10000000/s

NODE_PIDS=()
for i in $(seq 0 $((NODES - 1))); do cluster_node "$i"; done
for i in $(seq 0 $((NODES - 1))); do cluster_wait_health "$i" || true; done
RSS0_LINE=""
for p in "${NODE_PIDS[@]}"; do RSS0_LINE="$RSS0_LINE,$(rss_of "$p")"; done
CPU0=$(cpu_ticks "${NODE_PIDS[@]}" "$REDIS_PID")
T0=$(date +%s.%N)
GEN_PIDS=()
for i in $(seq 0 $((NODES - 1))); do
  url="http://127.0.0.1:$((BASE_PORT + i))"
  purl="http://127.0.0.1:$((BASE_PORT + (i + 1) % NODES))"
  for g in $(seq 1 "$GENS"); do
    "$LT" --quiet --target ringcast --url "$url" --publish-url "$purl" \
      --secret-key "$SK" --public-key "$PK" --label "scale/n$i/g$g" \
      fanout --subs "$PER_GEN" --channels 1 --own-channel --rate "$RATE" --duration "$DURATION" \
      --pub-conns 1 --connect-timeout 300 >"$TMP/gen-$i-$g.json" 2>"$TMP/gen-$i-$g.err" &
    GEN_PIDS+=("$!")
    PIDS+=("$!")
  done
done
# RSS per node once the fleet is connected: every node holds its connections, or
# (connections refused, e.g. by admission) their number stopped growing for 5 s.
want=$((PER_GEN * GENS))
RSS_LINE=""
last=-1; still=0
for _ in $(seq 1 600); do
  ok=1; total=0
  for p in "${NODE_PIDS[@]}"; do
    n=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
    total=$((total + n))
    [ "$n" -ge "$want" ] || ok=0
  done
  [ "$ok" = 1 ] && break
  if [ "$total" = "$last" ]; then still=$((still + 1)); else still=0; fi
  [ "$still" -ge 5 ] && break
  last=$total
  sleep 1
done
sleep 2
for p in "${NODE_PIDS[@]}"; do
  RSS_LINE="$RSS_LINE $(rss_of "$p")"
done
GEN_FAIL=0
for p in "${GEN_PIDS[@]}"; do wait "$p" || GEN_FAIL=1; done
CPU1=$(cpu_ticks "${NODE_PIDS[@]}" "$REDIS_PID")
REDIS_CPU=$(cpu_ticks "$REDIS_PID")
T1=$(date +%s.%N)
cat "$TMP"/gen-*.json >>"$RESULTS"
[ "$GEN_FAIL" = 0 ] || { echo "scale.sh: a generator reported a failure:" >&2; tail -n 3 "$TMP"/gen-*.err >&2 || true; }

python3 - "$TMP" "$NODES" "$PER_GEN" "$GENS" "$CPU0" "$CPU1" "$REDIS_CPU" "$T0" "$T1" "$(getconf CLK_TCK)" "${RSS0_LINE#,}" $RSS_LINE <<'EOF'
import glob, json, sys
tmp, nodes, per_gen, gens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cpu0, cpu1, redis_cpu, t0, t1, hz = (float(x) for x in sys.argv[5:11])
rss0 = [int(float(x)) for x in sys.argv[11].split(",")]
rss = [int(float(x)) for x in sys.argv[12:]]
files = sorted(glob.glob(tmp + "/gen-*.json"))
gens_out = [json.loads(l) for f in files for l in open(f) if l.strip()]
# gen-<node>-<g>.json: connections each node really holds (admission may refuse some).
held = [0] * nodes
for f in files:
    node = int(f.rsplit("/", 1)[-1].split("-")[1])
    for l in open(f):
        if l.strip():
            held[node] += json.loads(l).get("subscribers_ready", 0)
expected = sum(g.get("expected", 0) for g in gens_out)
received = sum(g.get("received", 0) for g in gens_out)
ready = sum(g.get("subscribers_ready", 0) for g in gens_out)
dups = sum(g.get("duplicates", 0) for g in gens_out)
cpu_s = (cpu1 - cpu0) / hz
def sum_maps(maps):
    out = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out
out = {
    "mode": "scale", "nodes": nodes, "generators": len(gens_out),
    "subs_per_generator": per_gen, "connections_held": ready,
    "expected": expected, "received": received, "duplicates": dups,
    "delivery_ratio": round(received / expected, 6) if expected else None,
    "latency_p50_us_max": max((g["latency"]["p50_us"] for g in gens_out if "latency" in g), default=None),
    "latency_p99_us_max": max((g["latency"]["p99_us"] for g in gens_out if "latency" in g), default=None),
    "latency_p99_us_per_generator": [g.get("latency", {}).get("p99_us") for g in gens_out],
    "connect_time_s_max": max((g.get("connect_time_s", 0) for g in gens_out), default=None),
    "close_codes": sum_maps(g.get("subscribers", {}).get("close_codes", {}) for g in gens_out),
    "connect_failures": sum_maps(g.get("subscribers", {}).get("failures", {}) for g in gens_out),
    "refused_status": sum_maps(g.get("subscribers", {}).get("refused_status", {}) for g in gens_out),
    "rss_bytes_per_node": rss,
    "rss_bytes_per_node_before_connect": rss0,
    "connections_per_node": held,
    # (RSS held - RSS before any client) / connections that node holds.
    "rss_bytes_per_connection": [round((r - r0) / max(1, h)) for r, r0, h in zip(rss, rss0, held)],
    "server_cpu_s_nodes_plus_redis": round(cpu_s, 3), "redis_cpu_s_total": round(redis_cpu / hz, 3),
    "window_s": round(t1 - t0, 3),
    "server_cpu_us_per_delivery_incl_connect": round(cpu_s * 1e6 / received, 3) if received else None,
    "ok": bool(expected) and received == expected and dups == 0 and ready == nodes * per_gen * gens,
}
print(json.dumps(out))
EOF
