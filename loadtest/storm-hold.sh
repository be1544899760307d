# storm-hold.sh: MODE=hold of storm.sh (sourced by it, never run): issue 26's `scale`
# scenario on the storm fleet. No node is signalled: once every client is subscribed
# (the common channel and its own), the publisher publishes for HOLD s, the window of
# CPU per delivery is measured around it, and one JSON line ("mode":"scale") reports
# connections, RSS, the ledger, the merged latency and CPU per delivery.
#
# Uses storm.sh's state (bash's dynamic scope: run_one's locals are visible here):
# common (the loadtest arguments every process of the run shares), WANT, GEN_PIDS,
# GEN_NODE, NODE_PIDS, REDIS_PID, PIDS, TMP, and the settings NODES, HOLD, DRAIN,
# COMMON_RATE, OWN_RATE, HZ, RESULTS, LT.

# messages_total: `message` frames received so far by the whole fleet (status files).
messages_total() {
  cat "$TMP"/status-* 2>/dev/null | awk '{m += $4} END {print m + 0}'
}

# held_per_node: Ready clients per node, from the status files. Until its first Ready
# a client stays on its generator's home node, so right after the connect phase (and
# with no loss since) this is where every client is.
held_per_node() {
  local out=() i g r n
  for i in $(seq 0 $((NODES - 1))); do out[i]=0; done
  for g in "${!GEN_NODE[@]}"; do
    r=$(awk '{print $1 + 0}' "$TMP/status-$g" 2>/dev/null || echo 0)
    n="${GEN_NODE[g]}"
    out[n]=$((out[n] + ${r:-0}))
  done
  echo "${out[*]}"
}

# hold_phase ADM RSS0: the fleet is connected; measure, publish, report. Returns 1
# unless the run is ok.
hold_phase() {
  local adm="$1" rss0="$2" i p held rss1="" fds1="" load_before
  # Let the connect phase's buffers go before reading RSS.
  sleep 2
  held=$(held_per_node)
  for i in $(seq 0 $((NODES - 1))); do
    p="${NODE_PIDS[i]}"
    rss1="$rss1 $(rss_of "$p")"
    fds1="$fds1 $(ls "/proc/$p/fd" 2>/dev/null | wc -l)"
  done
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  # /proc samples every 0.5 s until the stop: t_ms node cpu_ticks rss (node NODES is
  # redis-server). No fd listing: it costs a scan of ~20,000 entries per node.
  (
    while [ ! -e "$TMP/stop" ]; do
      t=$(now_ms)
      for j in $(seq 0 $((NODES - 1))); do
        echo "$t $j $(cpu_ticks "${NODE_PIDS[j]}") $(rss_of "${NODE_PIDS[j]}")"
      done
      echo "$t $NODES $(cpu_ticks "$REDIS_PID") $(rss_of "$REDIS_PID")"
      sleep 0.5
    done
  ) >"$TMP/samples" &
  PIDS+=("$!")

  # The window opens here, just before the publisher starts.
  local m0 cpu0 rcpu0 t0
  m0=$(messages_total)
  cpu0=$(cpu_ticks "${NODE_PIDS[@]}")
  rcpu0=$(cpu_ticks "$REDIS_PID")
  t0=$(now_ms)
  "$LT" "${common[@]}" --role publisher --total-clients "$WANT" --common-rate "$COMMON_RATE" \
    --own-rate "$OWN_RATE" >"$TMP/pub.json" 2>"$TMP/pub.err" &
  local pub_pid=$!
  PIDS+=("$pub_pid")
  echo "storm.sh: hold: publishing for $HOLD s (common $COMMON_RATE/s, own $OWN_RATE/s)" >&2
  sleep "$HOLD"
  touch "$TMP/stop"
  # It closes once the fleet's count has not moved for 1.5 s (three readings 0.5 s
  # apart; each status file is rewritten every 0.5 s), or 1 s before the clients'
  # drain ends (then say so: deliveries were still arriving).
  local t_stop m prev=-1 still=0 settled=true
  t_stop=$(now_ms)
  while :; do
    m=$(messages_total)
    if [ "$m" = "$prev" ]; then still=$((still + 1)); else still=0; fi
    prev=$m
    [ "$still" -ge 3 ] && break
    if [ $(($(now_ms) - t_stop)) -ge $((DRAIN * 1000 - 1000)) ]; then
      echo "storm.sh: hold: deliveries still arriving $((DRAIN - 1)) s after the publisher stopped" >&2
      settled=false
      break
    fi
    sleep 0.5
  done
  local m1 cpu1 rcpu1 t1 rss_end=""
  cpu1=$(cpu_ticks "${NODE_PIDS[@]}")
  rcpu1=$(cpu_ticks "$REDIS_PID")
  t1=$(now_ms)
  m1=$(messages_total)
  for i in $(seq 0 $((NODES - 1))); do rss_end="$rss_end $(rss_of "${NODE_PIDS[i]}")"; done

  local fail=0
  wait "$pub_pid" || fail=1
  for p in "${GEN_PIDS[@]}"; do wait "$p" || fail=1; done
  [ "$fail" = 0 ] || { echo "storm.sh: a generator or the publisher reported a failure" >&2; tail -n 3 "$TMP"/gen-*.err "$TMP/pub.err" >&2 || true; }
  python3 - "$TMP" "$adm" "$NODES" "$HZ" "$RESULTS" "$WANT" "$held" "$fds1" "$rss0" "$rss1" "$rss_end" \
    "$m0 $m1 $cpu0 $cpu1 $rcpu0 $rcpu1 $t0 $t_stop $t1" "$settled" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$HOLD $COMMON_RATE $OWN_RATE $DRAIN" <<'PY'
import glob, json, sys
sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, "loadtest")
import latency_merge
tmp, adm, nodes, hz, results, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
ints = lambda x: [int(float(v)) for v in x.split()]
held, fds, rss0, rss1, rss_end = (ints(a) for a in sys.argv[7:12])
m0, m1, cpu0, cpu1, rcpu0, rcpu1, t0, t_stop, t1 = ints(sys.argv[12])
settled, load_before, load_after = sys.argv[13] == "true", sys.argv[14], sys.argv[15]
hold, common_rate, own_rate, drain = (float(x) for x in sys.argv[16].split())
gens = [json.loads(l) for f in sorted(glob.glob(tmp + "/gen-*.json")) for l in open(f) if l.strip()]
pub = [json.loads(l) for l in open(tmp + "/pub.json") if l.strip()]
pub = pub[0] if pub else {}
s = lambda k: sum(g.get(k, 0) for g in gens)
latency = latency_merge.merge(gens)
# Peak RSS per node over the publishing window (0.5 s samples).
peak = {}
for line in open(tmp + "/samples"):
    parts = line.split()
    if len(parts) == 4:
        j, rss = int(parts[1]), int(float(parts[3]))
        peak[j] = max(peak.get(j, 0), rss)
deliveries = m1 - m0
close_codes = {}
for g in gens:
    for k, n in g.get("close_codes", {}).items():
        close_codes[k] = close_codes.get(k, 0) + n
node_cpu_s, redis_cpu_s = (cpu1 - cpu0) / hz, (rcpu1 - rcpu0) / hz
lost, dups, expected = s("lost"), s("duplicates"), s("expected")
per_us = lambda x: round(x * 1e6 / deliveries, 3) if deliveries else None
out = {
    "mode": "scale", "variant": "hold", "nodes": nodes, "max_upgrades_per_second": adm,
    "clients": s("clients"), "generators": len(gens),
    "hold_s": hold, "common_rate": common_rate, "own_rate": own_rate, "drain_s": drain,
    "connections_held": sum(held), "connections_held_per_node": held, "fds_per_node": fds,
    "ready_at_end": s("ready_at_end"),
    "rss_bytes_per_node_before_clients": rss0, "rss_bytes_per_node_connected": rss1,
    "rss_bytes_per_connection_per_node": [round((a - b) / h) if h else None for a, b, h in zip(rss1, rss0, held)],
    "rss_bytes_per_connection_all_nodes": round((sum(rss1) - sum(rss0)) / sum(held)) if sum(held) else None,
    "rss_bytes_per_node_end_of_window": rss_end,
    "rss_bytes_peak_per_node_in_window": [peak.get(j, 0) for j in range(nodes)],
    "redis_rss_bytes_peak": peak.get(nodes, 0),
    "expected": expected, "lost": lost, "duplicates": dups,
    "delivery_ratio": round(1 - lost / expected, 6) if expected else None,
    "expected_common": s("expected_common"), "lost_common": s("lost_common"),
    "expected_own": s("expected_own"), "lost_own": s("lost_own"),
    "messages": s("messages"), "replayed_messages": s("replayed_messages"),
    "latency": latency,
    "window": "publisher start -> fleet message count unchanged for 1.5 s after the publisher stopped",
    "window_ms": t1 - t0, "publishing_ms": t_stop - t0, "window_settled": settled,
    "deliveries_in_window": deliveries,
    "node_cpu_s": round(node_cpu_s, 3), "redis_cpu_s": round(redis_cpu_s, 3),
    "cpu_us_per_delivery_nodes_plus_redis": per_us(node_cpu_s + redis_cpu_s),
    "cpu_us_per_delivery_redis": per_us(redis_cpu_s),
    "refused_1013_first_connect": s("refused_1013_first_connect"), "losses": s("losses"),
    "close_codes": close_codes,
    "publisher": {k: pub.get(k) for k in ("publishes", "accepted", "accepted_common", "retries", "failed", "statuses")},
    "load_before": load_before, "load_after": load_after,
}
out["ok"] = (all(g.get("ok") for g in gens) and bool(pub.get("ok")) and bool(expected) and lost == 0
             and dups == 0 and out["connections_held"] == want and out["ready_at_end"] == want)
print(json.dumps(out))
with open(results, "a") as f:
    f.write(json.dumps(out) + "\n")
mib = lambda xs: [round(x / 2**20, 1) for x in xs]
print(f"scale (hold) admission={adm}/s: {out['connections_held']} of {want} connections held {held}; "
      f"RSS MiB per node {mib(rss0)} -> {mib(rss1)} ({out['rss_bytes_per_connection_all_nodes']} B per connection); "
      f"{pub.get('accepted')} publishes ({pub.get('accepted_common')} common); "
      f"lost {lost} ({out['lost_common']} common), duplicated {dups} of {expected} expected: ratio {out['delivery_ratio']}; "
      f"latency p50/p99/p999/max ms {latency_merge.ms(latency)}; "
      f"CPU {out['cpu_us_per_delivery_nodes_plus_redis']} us per delivery (redis {out['cpu_us_per_delivery_redis']}) "
      f"over {deliveries} deliveries in {t1 - t0} ms; load {load_before} -> {load_after}; ok={out['ok']}", file=sys.stderr)
sys.exit(0 if out["ok"] else 1)
PY
}
