#!/usr/bin/env bash
# scale.sh: the `scale` scenario of issue 26, by hand only (never in CI): the storm
# fleet of storm.sh in MODE=hold (no node is signalled), sized per node.
#
# NODES ringcast nodes in cluster mode on one local redis-server (each one process with
# --workers 1: with 5 nodes on a 2-core machine, more workers would only add threads
# fighting for the same cores), SUBS clients per node (`loadtest storm --role clients`,
# processes of at most GEN_MAX clients: the 20,000 open-files limit per process), every
# client subscribed to ONE common channel of the whole fleet and to a channel of its
# own. Once all are subscribed, one publisher (`--role publisher`) publishes for HOLD s
# to the common channel (COMMON_RATE/s: each publish goes to every client of every
# node) and round-robin to the own channels (OWN_RATE/s); the common channel's
# publishes go through node 0 and the own channels' through nodes 1 and 2 (storm.sh's
# publisher), so every delivery to a client of another node crosses Redis. History is on (HISTORY): the exact per-offset ledger
# needs positions; it costs one Redis write per publish, not per delivery.
#
# Reported (one JSON line on stdout, appended to RESULTS; a summary on stderr; exit 1
# unless ok): connections held per node; RSS per node before any client and once all
# are connected, and per connection; expected, lost and duplicated deliveries (delivery
# ratio = 1 - lost/expected), common and own apart; publish->delivery p50/p90/p99/p999/
# max merged over every generator's histogram; CPU µs per delivery of all nodes plus
# redis-server over the publishing window (storm.sh's header says exactly which window).
#
# Usage:
#   loadtest/scale.sh                                    # 3 nodes x 1,000 clients (smoke size)
#   NODES=5 SUBS=19800 HOLD=20 loadtest/scale.sh         # ~100,000 (99,000) connections
# Environment: RC_BIN (default target/release/ringcast), LT_BIN (default
# target/release/loadtest), NODES (3), SUBS (clients per node, 1,000), HOLD (s of
# publishing, 20; DURATION is read as HOLD), COMMON_RATE (1/s), OWN_RATE (200/s),
# GEN_MAX (clients per generator process, 9,900), DRAIN (10 s), ADMISSIONS (the nodes'
# max_upgrades_per_second; default RINGCAST_MAX_UPGRADES_PER_SECOND if set, else the
# server's default 2,000: the clients honour 1013 and retry), CONNECT_RATE, HISTORY,
# BASE_PORT (28400), REDIS_PORT (28399), RESULTS, KEEP_TMP=1. Any other storm.sh
# variable passes through.
set -euo pipefail
cd "$(dirname "$0")/.."
SUBS="${SUBS:-1000}"
# The fanout-based scale.sh of before took GENS_PER_NODE and RATE: say what they became.
if [ -n "${GENS_PER_NODE:-}" ] && [ -z "${GEN_MAX:-}" ]; then
  GEN_MAX=$(((SUBS + GENS_PER_NODE - 1) / GENS_PER_NODE))
  export GEN_MAX
fi
[ -z "${RATE:-}" ] || echo "scale.sh: RATE is not read any more (one common channel: COMMON_RATE, own channels: OWN_RATE)" >&2
export MODE=hold
export VICTIM_CLIENTS="$SUBS" OTHER_CLIENTS="$SUBS"
export HOLD="${HOLD:-${DURATION:-20}}"
export COMMON_RATE="${COMMON_RATE:-1}"
export OWN_RATE="${OWN_RATE:-200}"
export ADMISSIONS="${ADMISSIONS:-${RINGCAST_MAX_UPGRADES_PER_SECOND:-2000}}"
export BASE_PORT="${BASE_PORT:-28400}"
export REDIS_PORT="${REDIS_PORT:-28399}"
exec bash loadtest/storm.sh
