# lib-cluster.sh: the start-up shared by scale.sh and storm.sh (sourced, never run):
# one local redis-server, a master key, a project, N ringcast nodes in cluster mode
# (each one process with --workers 1), and /proc readings of them.
#
# The caller sets RC (ringcast binary), TMP (a private temp dir), REDIS_PORT, BASE_PORT,
# and an array PIDS (every process started is appended, so the caller's EXIT trap can
# stop them newest first). Functions set globals rather than print, so they can be
# called without a subshell (a subshell's background processes would not be ours).

# cluster_redis: start redis-server on REDIS_PORT; sets REDIS_PID and REDIS_URL.
cluster_redis() {
  command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; return 1; }
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --maxclients 10000 --dir "$TMP" >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  local _
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/master.key"
  chmod 600 "$TMP/master.key"
  export RINGCAST_MASTER_KEY_FILE="$TMP/master.key"
}

# cluster_project NAME [project create flags...]: sets SK and PK.
cluster_project() {
  local name="$1"
  shift
  "$RC" --redis "$REDIS_URL" project create "$name" "$@" >"$TMP/keys-$name.json"
  SK="$(sed -n 's/.*"secret_key":"\(sk_[^"]*\)".*/\1/p' "$TMP/keys-$name.json")"
  PK="$(sed -n 's/.*"public_key":"\(pk_[^"]*\)".*/\1/p' "$TMP/keys-$name.json")"
  [ -n "$SK" ] && [ -n "$PK" ] || { echo "no keys from: $(cat "$TMP/keys-$name.json")" >&2; return 1; }
}

# cluster_node I [serve flags...]: start node I on BASE_PORT+I (data dir TMP/nI, log
# TMP/nodeI.log, appended to on a restart); sets NODE_PIDS[I]. Does not wait.
cluster_node() {
  local i="$1"
  shift
  mkdir -p "$TMP/n$i"
  "$RC" --redis "$REDIS_URL" serve --data-dir "$TMP/n$i" --listen "127.0.0.1:$((BASE_PORT + i))" \
    --workers 1 "$@" >>"$TMP/node$i.log" 2>&1 &
  NODE_PIDS[i]=$!
  PIDS+=("$!")
}

# cluster_wait_health I: until node I answers /health (at most 10 s).
cluster_wait_health() {
  local _
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$((BASE_PORT + $1))/health" >/dev/null && return 0
    sleep 0.1
  done
  echo "node $1 never answered /health" >&2
  return 1
}

# cpu_ticks PID...: sum of utime+stime (clock ticks); a vanished pid counts 0.
cpu_ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  echo "$t"
}

# rss_of PID: resident bytes (0 when gone).
rss_of() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status" 2>/dev/null || echo 0; }
