#!/usr/bin/env bash
# storm.sh: the `storm` scenario of issue 26 and the rolling restart, by hand only, and
# (MODE=hold) the issue's `scale` scenario, which loadtest/scale.sh runs. See
# RELIABILITY.md and BENCHMARKS.md for the figures and the exact commands.
#
# Per run: redis-server and NODES ringcast nodes in cluster mode (lib-cluster.sh), one
# project with history (HISTORY, large enough to hold the whole gap), a fleet of
# reconnecting clients (`loadtest storm --role clients`, processes of at most GEN_MAX
# clients each: the 20,000 open-files limit per process), every client on the common
# channel and on its own; VICTIM_CLIENTS start on node 0, OTHER_CLIENTS on each other
# node. Once all are subscribed, a publisher (`--role publisher`) publishes through
# every node to the common channel (COMMON_RATE/s) and to the own channels (OWN_RATE/s),
# failing over with the same Idempotency-Key. Then:
#   MODE=kill    SIGKILL node 0; wait until every client is back (connected and
#                resubscribed with `since`), AFTER more seconds of publishing, stop.
#   MODE=term    the same with SIGTERM (1001 closes spread over drain_spread_s).
#   MODE=rolling SIGTERM each node in turn, wait for it to exit, start it again at once
#                (as a deploy does), wait until every client is back, next node.
#   MODE=hold    no signal (issue 26's `scale`): the publisher publishes for HOLD s, then
#                stops; the clients keep receiving DRAIN s. See "MODE=hold" below.
# Each admission value in ADMISSIONS is one full run (fresh cluster), so "on" and
# "off" are measured by the same invocation: ADMISSIONS="2000 0".
#
# Reported (one JSON line per run on stdout, appended to RESULTS, and a summary on
# stderr): time from the signal until every client was back, reconnects, recovered
# true/false, lost and duplicated messages (both must be 0), 1013 refusals seen by the
# clients and the nodes' ringcast_upgrades_refused_total, peak upgrades/s that became
# Ready per surviving node, peak CPU (% of one core, 0.5 s samples of /proc) and peak
# RSS and fds per surviving node, the machine's load average, and the publish->delivery
# latency of live deliveries (a recovery's replay is not timed: `replayed_messages`),
# merged over every generator's histogram (latency_merge.py).
#
# MODE=hold reports instead (one JSON line, "mode":"scale"): connections held per node
# (the clients' status files, and the node's open fds); RSS per node before any client
# and once the fleet is connected (2 s after the last client was subscribed), and their
# difference per connection; the same ledger (expected, lost, duplicated; delivery
# ratio = 1 - lost/expected), split common/own; the publish->delivery latency merged
# over every generator's histogram (p50/p90/p99/p999/max); and CPU µs per delivery: the
# CPU ticks of every node plus redis-server over the publishing window, divided by the
# messages the fleet received in that window. The window opens just before the
# publisher starts (no publish before it) and closes once the fleet's message count
# (status files, rewritten every 0.5 s) has not moved for 1.5 s after the publisher
# stopped: it holds every delivery of the run and at most ~2 s of idle tail. Exit 1
# unless ok (0 lost, 0 duplicated, every client held, every publish accepted).
#
# Usage:
#   loadtest/storm.sh                                   # 3 nodes x 1,000 clients, kill
#   NODES=5 VICTIM_CLIENTS=19800 OTHER_CLIENTS=14800 MODE=kill ADMISSIONS="2000 0" loadtest/storm.sh
#   NODES=5 VICTIM_CLIENTS=14800 OTHER_CLIENTS=14800 MODE=rolling loadtest/storm.sh
#   NODES=3 VICTIM_CLIENTS=300 OTHER_CLIENTS=300 MODE=hold HOLD=3 loadtest/storm.sh   # smoke
# Environment: RC_BIN, LT_BIN (default target/release/...), NODES, VICTIM_CLIENTS,
# OTHER_CLIENTS, GEN_MAX (9,900), MODE, ADMISSIONS ("2000 0"; hold: "2000", the
# server's default, once), HOLD (hold: 20 s of publishing), DRAIN (hold: 10 s the
# clients keep receiving after the publisher stopped; other modes 5), COMMON_RATE (2),
# OWN_RATE (200), WARM (5 s of publishing before the signal), AFTER (5 s after all are
# back), BACK_TIMEOUT (120 s), HISTORY (2000/600s), CONNECT_RATE (first connects/s per
# generator, 800), BALANCE (leastconn: reconnects go to the node holding the fewest
# connections, by the nodes' fd counts sampled every 0.5 s, as HAProxy's leastconn would;
# roundrobin: each generator rotates over the live nodes), BASE_PORT (28500), REDIS_PORT (28499), RESULTS, KEEP_TMP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
RC="${RC_BIN:-target/release/ringcast}"
LT="${LT_BIN:-target/release/loadtest}"
NODES="${NODES:-3}"
VICTIM_CLIENTS="${VICTIM_CLIENTS:-1000}"
OTHER_CLIENTS="${OTHER_CLIENTS:-1000}"
GEN_MAX="${GEN_MAX:-9900}"
MODE="${MODE:-kill}"
if [ "$MODE" = hold ]; then ADMISSIONS="${ADMISSIONS:-2000}"; else ADMISSIONS="${ADMISSIONS:-2000 0}"; fi
HOLD="${HOLD:-20}"
DRAIN="${DRAIN:-10}"
COMMON_RATE="${COMMON_RATE:-2}"
OWN_RATE="${OWN_RATE:-200}"
WARM="${WARM:-5}"
AFTER="${AFTER:-5}"
BACK_TIMEOUT="${BACK_TIMEOUT:-120}"
HISTORY="${HISTORY:-2000/600s}"
CONNECT_RATE="${CONNECT_RATE:-800}"
BALANCE="${BALANCE:-leastconn}"
BASE_PORT="${BASE_PORT:-28500}"
REDIS_PORT="${REDIS_PORT:-28499}"
RESULTS="${RESULTS:-/dev/null}"
case "$BALANCE" in leastconn | roundrobin) ;; *) echo "storm.sh: BALANCE is leastconn or roundrobin" >&2; exit 1 ;; esac
case "$MODE" in kill | term | rolling | hold) ;; *) echo "storm.sh: MODE is kill, term, rolling or hold" >&2; exit 1 ;; esac
[ -x "$RC" ] || { echo "storm.sh: no ringcast binary at $RC (cargo build --release, or RC_BIN)" >&2; exit 1; }
[ -x "$LT" ] || { echo "storm.sh: no loadtest binary at $LT (cargo build --release -p loadtest, or LT_BIN)" >&2; exit 1; }
[ "$MODE" != hold ] || [ "$DRAIN" -ge 3 ] || { echo "storm.sh: DRAIN must be at least 3 s (the window waits 1.5 s of quiet)" >&2; exit 1; }
[ "$GEN_MAX" -lt 19000 ] || { echo "storm.sh: GEN_MAX must stay under 19,000 (open files)" >&2; exit 1; }
HZ=$(getconf CLK_TCK)
now_ms() { date +%s%3N; }

PIDS=()
TMP=""
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
cleanup() {
  stop_all
  if [ -n "$TMP" ]; then
    [ "${KEEP_TMP:-0}" = 1 ] && echo "storm.sh: logs kept in $TMP" >&2 || rm -rf "$TMP"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=loadtest/lib-cluster.sh
. loadtest/lib-cluster.sh

# ready_total: "<ready> <total>" summed over every generator's status file.
# (Each status file is `<ready> <total> <lost now> <messages received>`.)
ready_total() {
  cat "$TMP"/status-* 2>/dev/null | awk '{r += $1; t += $2} END {print r + 0, t + 0}'
}
# wait_all_back TIMEOUT: until every client is subscribed; prints the ms it took.
wait_all_back() {
  local t0 r t
  t0=$(now_ms)
  while :; do
    read -r r t < <(ready_total)
    [ "$r" -eq "$WANT" ] && [ "$t" -eq "$WANT" ] && break
    if [ $(($(now_ms) - t0)) -gt $(($1 * 1000)) ]; then
      echo "storm.sh: only $r of $WANT clients back after $1 s" >&2
      return 1
    fi
    sleep 0.2
  done
  echo $(($(now_ms) - t0))
}

run_one() {
  local adm="$1"
  TMP="$(mktemp -d)"
  NODE_PIDS=()
  export RINGCAST_MAX_UPGRADES_PER_SECOND="$adm"
  cluster_redis
  cluster_project storm --rate-limit 10000000/s --history "$HISTORY"
  local i
  for i in $(seq 0 $((NODES - 1))); do
    cluster_node "$i" --metrics-listen "127.0.0.1:$((BASE_PORT + 50 + i))"
    echo "${NODE_PIDS[i]}" >"$TMP/node$i.pid"
  done
  for i in $(seq 0 $((NODES - 1))); do cluster_wait_health "$i"; done
  # Each node's RSS before any client (hold: the base of RSS per connection).
  local rss0=""
  for i in $(seq 0 $((NODES - 1))); do rss0="$rss0 $(rss_of "${NODE_PIDS[i]}")"; done
  local urls="" tag
  for i in $(seq 0 $((NODES - 1))); do urls="$urls,http://127.0.0.1:$((BASE_PORT + i))"; done
  urls="${urls#,}"
  tag="s$(date +%s)"
  local common=(--quiet --secret-key "$SK" --public-key "$PK" --tag "$tag" storm --nodes "$urls"
    --stop-file "$TMP/stop" --accepted-file "$TMP/accepted" --duration 3600)
  if [ "$MODE" = hold ]; then common+=(--drain "$DRAIN"); fi

  # The fleet: per node, processes of at most GEN_MAX clients.
  local first=0 g=0 n per gens k
  GEN_PIDS=()
  GEN_NODE=()
  for i in $(seq 0 $((NODES - 1))); do
    n=$OTHER_CLIENTS
    [ "$i" = 0 ] && n=$VICTIM_CLIENTS
    gens=$(((n + GEN_MAX - 1) / GEN_MAX))
    for k in $(seq 1 "$gens"); do
      per=$((n / gens + (k <= n % gens ? 1 : 0)))
      "$LT" --label "storm/n$i/g$k" "${common[@]}" --role clients --clients "$per" \
        --first-client "$first" --home-node "$i" --connect-rate "$CONNECT_RATE" \
        --status-file "$TMP/status-$g" --loads-file "$TMP/loads" >"$TMP/gen-$g.json" 2>"$TMP/gen-$g.err" &
      GEN_PIDS+=("$!")
      GEN_NODE+=("$i")
      PIDS+=("$!")
      first=$((first + per))
      g=$((g + 1))
    done
  done
  WANT=$first
  echo "storm.sh: $MODE, admission $adm/s: $WANT clients on $NODES nodes ($g generator processes)" >&2
  wait_all_back 600 >/dev/null || { tail -n 3 "$TMP"/gen-*.err >&2; return 1; }
  local fds0=""
  for i in $(seq 0 $((NODES - 1))); do fds0="$fds0 $(ls "/proc/${NODE_PIDS[i]}/fd" | wc -l)"; done
  if [ "$MODE" = hold ]; then
    hold_phase "$adm" "$rss0" || HOLD_FAIL=1
    finish_run
    return
  fi

  "$LT" "${common[@]}" --role publisher --total-clients "$WANT" --common-rate "$COMMON_RATE" \
    --own-rate "$OWN_RATE" >"$TMP/pub.json" 2>"$TMP/pub.err" &
  local pub_pid=$!
  PIDS+=("$pub_pid")
  # /proc samples of every node every 0.5 s: t_ms node cpu_ticks rss fds.
  # With BALANCE=leastconn the same fds are the balancer's view (TMP/loads, read by the
  # generators every 500 ms; a dead node counts as full).
  (
    while [ ! -e "$TMP/stop" ]; do
      t=$(now_ms)
      loads=""
      for j in $(seq 0 $((NODES - 1))); do
        p=$(cat "$TMP/node$j.pid")
        if [ ! -d "/proc/$p" ] || grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
          loads="$loads 999999999"
          continue
        fi
        fds=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
        loads="$loads $fds"
        echo "$t $j $(cpu_ticks "$p") $(rss_of "$p") $fds"
      done
      if [ "$BALANCE" = leastconn ]; then
        echo "$loads" >"$TMP/loads.tmp" && mv "$TMP/loads.tmp" "$TMP/loads"
      fi
      sleep 0.5
    done
  ) >"$TMP/samples" &
  PIDS+=("$!")
  sleep "$WARM"
  local load_before events=""
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  if [ "$MODE" = rolling ]; then
    for i in $(seq 0 $((NODES - 1))); do
      local t_sig t_exit back
      t_sig=$(now_ms)
      kill -TERM "${NODE_PIDS[i]}"
      while kill -0 "${NODE_PIDS[i]}" 2>/dev/null && [ -d "/proc/${NODE_PIDS[i]}" ] \
        && ! grep -q '^State:.*Z' "/proc/${NODE_PIDS[i]}/status" 2>/dev/null; do sleep 0.1; done
      t_exit=$(now_ms)
      # Reap it: only then have all its threads let go of its sockets (its leader turns
      # zombie first), so the new process can bind the same ports.
      wait "${NODE_PIDS[i]}" 2>/dev/null || true
      # A deploy starts the new process as soon as the old one is gone, so its clients
      # come back to the restarted node as well as to the others (leastconn sends the
      # first ones to it: it is empty).
      cluster_node "$i" --metrics-listen "127.0.0.1:$((BASE_PORT + 50 + i))"
      echo "${NODE_PIDS[i]}" >"$TMP/node$i.pid"
      cluster_wait_health "$i"
      back=$(wait_all_back "$BACK_TIMEOUT") || back=-1
      events="$events {\"node\":$i,\"signal\":\"TERM\",\"t_signal_ms\":$t_sig,\"exit_ms\":$((t_exit - t_sig)),\"back_ms_after_signal\":$(($(now_ms) - t_sig)),\"back_ok\":$([ "$back" -ge 0 ] && echo true || echo false)},"
      echo "storm.sh: node $i restarted; all back $((back < 0 ? -1 : $(now_ms) - t_sig)) ms after its SIGTERM" >&2
    done
  else
    local sig=KILL t_sig back
    [ "$MODE" = term ] && sig=TERM
    t_sig=$(now_ms)
    kill -"$sig" "${NODE_PIDS[0]}"
    while [ -d "/proc/${NODE_PIDS[0]}" ] && ! grep -q '^State:.*Z' "/proc/${NODE_PIDS[0]}/status" 2>/dev/null; do sleep 0.1; done
    sleep 0.5
    back=$(wait_all_back "$BACK_TIMEOUT") || back=-1
    events="{\"node\":0,\"signal\":\"$sig\",\"t_signal_ms\":$t_sig,\"back_ms_after_signal\":$(($(now_ms) - t_sig)),\"back_ok\":$([ "$back" -ge 0 ] && echo true || echo false)},"
  fi
  sleep "$AFTER"
  local refused=""
  for i in $(seq 0 $((NODES - 1))); do
    refused="$refused $(curl -fs "http://127.0.0.1:$((BASE_PORT + 50 + i))/metrics" 2>/dev/null \
      | awk '/^ringcast_upgrades_refused_total/ {s += $2} END {print s + 0}' || true)"
  done
  touch "$TMP/stop"
  local fail=0 p
  wait "$pub_pid" || fail=1
  for p in "${GEN_PIDS[@]}"; do wait "$p" || fail=1; done
  [ "$fail" = 0 ] || { echo "storm.sh: a generator or the publisher reported a failure" >&2; tail -n 3 "$TMP"/gen-*.err "$TMP/pub.err" >&2 || true; }
  python3 - "$TMP" "$MODE" "$adm" "$NODES" "$HZ" "[${events%,}]" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" "$fds0" "$refused" "$RESULTS" "$BALANCE" <<'PY'
import glob, json, sys
sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, "loadtest")
import latency_merge
tmp, mode, adm, nodes, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
results, balance = sys.argv[11], sys.argv[12]
events = json.loads(sys.argv[6]); load_before, load_after = sys.argv[7], sys.argv[8]
fds0 = [int(x) for x in sys.argv[9].split()]; refused_metric = [int(float(x)) for x in sys.argv[10].split()]
gens = [json.loads(l) for f in sorted(glob.glob(tmp + "/gen-*.json")) for l in open(f) if l.strip()]
pub = [json.loads(l) for l in open(tmp + "/pub.json") if l.strip()]
pub = pub[0] if pub else {}
s = lambda k: sum(g.get(k, 0) for g in gens)
t0 = min(e["t_signal_ms"] for e in events)
victims = {e["node"] for e in events} if mode != "rolling" else set()
survivors = [i for i in range(nodes) if i not in victims]
# Upgrades that became Ready, per node and second, from the signal on.
ups = {}
for g in gens:
    for node, secs in g.get("upgrades_ready_per_node_second", {}).items():
        for sec, n in secs.items():
            if int(sec) * 1000 >= t0 - 999:
                ups.setdefault(int(node), {}).setdefault(int(sec), 0)
                ups[int(node)][int(sec)] += n
peak_ups = {i: max(ups.get(i, {0: 0}).values()) for i in survivors}
# /proc samples: peak CPU (% of one core over each 0.5 s step), RSS and fds, after the signal.
samples = {}
for line in open(tmp + "/samples"):
    parts = line.split()
    if len(parts) != 5:  # a node that died between two reads of one sample
        continue
    t, j, ticks, rss, fds = (int(float(x)) for x in parts)
    samples.setdefault(j, []).append((t, ticks, rss, fds))
peak = {}
for j in survivors:
    xs = samples.get(j, [])
    cpu = [100.0 * (b[1] - a[1]) / hz / ((b[0] - a[0]) / 1000) for a, b in zip(xs, xs[1:])
           if b[0] >= t0 and b[0] > a[0] and b[1] >= a[1]]
    after = [x for x in xs if x[0] >= t0]
    peak[j] = {"cpu_pct": round(max(cpu, default=0), 1),
               "rss_bytes": max((x[2] for x in after), default=0),
               "fds": max((x[3] for x in after), default=0)}
back_after = max(e["back_ms_after_signal"] for e in events)
last_back = max((g.get("last_back_unix_ms", 0) for g in gens), default=0)
lost, dups = s("lost"), s("duplicates")
rec_t, rec_f = s("recovered_true"), s("recovered_false")
out = {
    "mode": "storm", "variant": mode, "balance": balance, "max_upgrades_per_second": adm, "nodes": nodes,
    "clients": s("clients"), "generators": len(gens), "events": events,
    "all_back_ms_after_signal": back_after,
    "last_client_back_ms_after_signal": (last_back - t0) if last_back else None,
    "clients_lost_connection": s("losses"), "attempts": s("attempts"),
    "recovered_true": rec_t, "recovered_false": rec_f,
    "recovered_false_fresh": s("recovered_false_fresh"),
    "expected": s("expected"), "messages": s("messages"), "lost": lost, "duplicates": dups,
    "foreign_epoch": s("foreign_epoch"),
    "refused_1013_clients": s("refused_1013"),
    "refused_1013_first_connect": s("refused_1013_first_connect"),
    "upgrades_refused_metric_per_node": refused_metric,
    "peak_ready_upgrades_per_s_per_survivor": peak_ups,
    "peak_per_survivor": peak, "fds_per_node_before": fds0,
    "back_ms_p50_max": max((g["back_ms"]["p50"] or 0 for g in gens), default=None),
    "back_ms_p99_max": max((g["back_ms"]["p99"] or 0 for g in gens), default=None),
    "publisher": {k: pub.get(k) for k in ("publishes", "accepted", "retries", "replayed", "failed", "publisher_duplicate_offsets", "statuses")},
    # Publish->delivery of live deliveries only (a recovery's replay is not timed).
    "latency": latency_merge.merge(gens), "replayed_messages": s("replayed_messages"),
    "load_before": load_before, "load_after": load_after,
    "ok": all(g.get("ok") for g in gens) and bool(pub.get("ok")) and lost == 0 and dups == 0
          and rec_f == 0 and all(e["back_ok"] for e in events),
}
print(json.dumps(out))
with open(results, "a") as f:
    f.write(json.dumps(out) + "\n")
print(f"storm {mode} admission={adm}/s: {out['clients']} clients, {out['clients_lost_connection']} connections lost; "
      f"all back {back_after} ms after the signal; recovered {rec_t} true / {rec_f} false; "
      f"lost {lost}, duplicated {dups} of {out['expected']} expected deliveries; 1013 seen by clients {out['refused_1013_clients']} "
      f"(metric {sum(refused_metric)}); peak Ready upgrades/s per survivor {list(peak_ups.values())}; "
      f"peak CPU % {[p['cpu_pct'] for p in peak.values()]}; peak RSS MiB {[round(p['rss_bytes'] / 2**20) for p in peak.values()]}; "
      f"peak fds {[p['fds'] for p in peak.values()]}; publisher {pub.get('accepted')} accepted, {pub.get('retries')} retries, "
      f"{pub.get('replayed')} replayed; latency p50/p99/p999/max ms {latency_merge.ms(out['latency'])}; load {load_before} -> {load_after}; ok={out['ok']}", file=sys.stderr)
PY
  finish_run
}

# finish_run: stop this run's processes and drop (or keep) its temp dir.
finish_run() {
  stop_all
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "storm.sh: logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
  TMP=""
}

# shellcheck source=loadtest/storm-hold.sh
. loadtest/storm-hold.sh

HOLD_FAIL=0
for adm in $ADMISSIONS; do
  run_one "$adm"
done
[ "$HOLD_FAIL" = 0 ]
