#!/usr/bin/env bash
# Installs (Debian packages) and runs the services the tests need, on loopback, on ports of their
# own so they never meet a system-wide instance: Redis, RabbitMQ with the management plugin,
# PostgreSQL and Alertmanager.
#
#   scripts/services.sh up        start whatever is not already running (idempotent)
#   scripts/services.sh down      stop exactly what `up` started, by PID
#   scripts/services.sh status    one line per service
#   source scripts/services.sh env   export the connection URLs (TASKHERD_*_URL …), nothing else
#
# State (data, logs, PID files) lives in $TASKHERD_SERVICES_DIR, outside any checkout, so a new
# clone reuses it and a stale PID file from a killed run is detected and replaced.

TASKHERD_SERVICES_DIR=${TASKHERD_SERVICES_DIR:-/var/lib/taskherd/services}
# Services listen on loopback; the demo adds the cluster bridge address so pods can reach them.
TASKHERD_SERVICES_BIND=${TASKHERD_SERVICES_BIND:-127.0.0.1}
# Ports and credentials: scripts/services.env (shared with e2e/lib); the environment may override a port.
_services_env_defaults() {
  local key value
  while IFS='=' read -r key value; do
    case "$key" in ''|'#'*) continue ;; esac
    [ -n "${!key:-}" ] || printf -v "$key" '%s' "$value"
  done <"$(dirname "${BASH_SOURCE[0]}")/services.env"
}
_services_env_defaults

export_env() {
  export TASKHERD_SERVICES_DIR
  export TASKHERD_REDIS_URL="redis://127.0.0.1:${REDIS_PORT}/0"
  export TASKHERD_AMQP_URL="amqp://${SERVICE_USER}:${SERVICE_PASSWORD}@127.0.0.1:${RABBITMQ_PORT}//"
  export TASKHERD_RABBITMQ_API_URL="http://${SERVICE_USER}:${SERVICE_PASSWORD}@127.0.0.1:${RABBITMQ_MGMT_PORT}"
  export TASKHERD_PG_DSN="postgresql://${SERVICE_USER}:${SERVICE_PASSWORD}@127.0.0.1:${PG_PORT}/taskherd"
  export TASKHERD_PROMETHEUS_URL="http://127.0.0.1:${PROMETHEUS_PORT}"
  export TASKHERD_ALERTMANAGER_URL="http://127.0.0.1:${ALERTMANAGER_PORT}"
  export TASKHERD_RABBITMQ_CTL="${TASKHERD_SERVICES_DIR}/rabbitmq/ctl"
}

# Sourced (`source scripts/services.sh env`, often into an interactive shell): the URLs only; no
# shell options and no functions beyond these two.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  export_env
  return 0
fi

set -euo pipefail
LOG_TAG=services
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# A port held on one of our addresses (or on all addresses) by a process we did not start is a clear
# error, not a hang. A listener on another address is no conflict: the demo's forwarders listen on
# the cluster bridge with the same port numbers.
refuse_foreign_port() {  # refuse_foreign_port NAME PORT
  local taken
  taken=$(ss -Hltnp "sport = :$2" | awk -v port="$2" -v ours="${TASKHERD_SERVICES_BIND//,/ }" '
    BEGIN { n = split(ours, a, " "); for (i = 1; i <= n; i++) mine[a[i] ":" port] = 1
            mine["0.0.0.0:" port] = 1; mine["*:" port] = 1; mine["[::]:" port] = 1 }
    $4 in mine')
  if [ -n "$taken" ]; then
    log "port $2 for $1 is in use by a process this script did not start:"
    echo "$taken" >&2
    return 1
  fi
}

# A service that answers is reused; otherwise its packages are installed (a step of their own) and
# it is started, and its start-up time is recorded.
service_reused() { step_done "service $1" reused 0; }
service_started() {  # service_started NAME T0 WHERE
  step_done "service $1" started $((SECONDS - $2))
  log "$1 on $3 (started in $(fmt_duration $((SECONDS - $2))))"
}

# --- Redis -------------------------------------------------------------------------------------
redis_ping() { redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
redis_up() {
  local dir=$TASKHERD_SERVICES_DIR/redis
  if redis_ping && pidfile_pid "$dir/pid" >/dev/null; then service_reused redis; return 0; fi
  apt_install redis-server redis-tools
  local t0=$SECONDS
  mkdir -p "$dir"; rm -f "$dir/pid"
  refuse_foreign_port redis "$REDIS_PORT"
  redis-server --port "$REDIS_PORT" --bind "${TASKHERD_SERVICES_BIND//,/ }" --protected-mode no \
    --daemonize yes --pidfile "$dir/pid" --dir "$dir" --logfile "$dir/redis.log" \
    --save "" --appendonly no
  wait_for redis 20 redis_ping || die "redis did not answer on :$REDIS_PORT (log: $dir/redis.log)"
  service_started redis "$t0" ":$REDIS_PORT"
}

# --- RabbitMQ ----------------------------------------------------------------------------------
rabbitmq_env() {
  local dir=$TASKHERD_SERVICES_DIR/rabbitmq
  export HOME=$dir  # the Erlang cookie lives in $HOME
  export RABBITMQ_NODENAME=taskherd@localhost
  export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
  export RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log
  export RABBITMQ_PID_FILE=$dir/pid RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
  export RABBITMQ_DIST_PORT ERL_EPMD_ADDRESS=127.0.0.1
  # a node that fails to start writes its crash dump here, not into the caller's working directory
  export ERL_CRASH_DUMP=$dir/log/erl_crash.dump
}
rabbitmqctl_() { (rabbitmq_env; /usr/lib/rabbitmq/bin/rabbitmqctl "$@"); }
rabbitmq_ready() { rabbitmqctl_ -q status >/dev/null 2>&1 && curl -sf -u "$SERVICE_USER:$SERVICE_PASSWORD" "http://127.0.0.1:$RABBITMQ_MGMT_PORT/api/overview" >/dev/null; }
# A node answering under our node name with our private cookie is ours even without its PID file
# (lost to a crash, or to two starts racing before the lock below existed): record its PID so that
# `down` can stop it, instead of refusing its port as a stranger's.
rabbitmq_adopt() {
  local pid
  pid=$(rabbitmqctl_ -q eval 'os:getpid().' 2>/dev/null | tr -dc 0-9)
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  echo "$pid" >"$1"
  log "rabbitmq: adopted the running node taskherd@localhost (pid $pid), whose PID file was missing"
}
rabbitmq_up() {
  local dir=$TASKHERD_SERVICES_DIR/rabbitmq pid
  if pidfile_pid "$dir/pid" >/dev/null && rabbitmq_ready; then service_reused rabbitmq; return 0; fi
  if [ -f "$dir/.erlang.cookie" ] && rabbitmq_ready && rabbitmq_adopt "$dir/pid"; then
    service_reused rabbitmq; return 0
  fi
  apt_install rabbitmq-server curl
  local t0=$SECONDS
  if pid=$(pidfile_pid "$dir/pid"); then  # alive but not answering: a half-started node from a killed run
    kill "$pid"; sleep 2
  fi
  rm -f "$dir/pid"
  refuse_foreign_port rabbitmq "$RABBITMQ_PORT"
  mkdir -p "$dir/log"
  local listeners="" i=1
  for addr in ${TASKHERD_SERVICES_BIND//,/ }; do
    listeners+="listeners.tcp.$i = $addr:$RABBITMQ_PORT"$'\n'; i=$((i + 1))
  done
  cat >"$dir/rabbitmq.conf" <<EOF
$listeners
management.tcp.port = $RABBITMQ_MGMT_PORT
management.tcp.ip = 0.0.0.0
loopback_users = none
# Tests kill workers on purpose; a dead consumer's deliveries must come back promptly.
heartbeat = 10
EOF
  echo "[rabbitmq_management]." >"$dir/enabled_plugins"
  # The cookie must exist before the first rabbitmqctl call and be private.
  [ -f "$dir/.erlang.cookie" ] || { head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/.erlang.cookie"; }
  chmod 600 "$dir/.erlang.cookie"
  (rabbitmq_env; setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/log/startup.log" 2>&1 </dev/null &)
  wait_for "rabbitmq node" 90 rabbitmqctl_ -q -t 5 await_startup || die "rabbitmq did not start (logs: $dir/log)"
  # The default guest account only works from loopback: pods need a real user.
  rabbitmqctl_ -q add_user "$SERVICE_USER" "$SERVICE_PASSWORD" 2>/dev/null || true
  rabbitmqctl_ -q set_user_tags "$SERVICE_USER" administrator
  rabbitmqctl_ -q set_permissions -p / "$SERVICE_USER" ".*" ".*" ".*"
  wait_for "rabbitmq management API" 60 rabbitmq_ready ||
    die "rabbitmq's management API did not answer on :$RABBITMQ_MGMT_PORT (logs: $dir/log)"
  service_started rabbitmq "$t0" ":$RABBITMQ_PORT (management :$RABBITMQ_MGMT_PORT)"
}

# --- PostgreSQL --------------------------------------------------------------------------------
pg_bin=/usr/lib/postgresql/15/bin
pg_ready() { "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }
postgres_up() {
  local dir=$TASKHERD_SERVICES_DIR/postgres
  if pg_ready && [ -f "$dir/data/postmaster.pid" ]; then service_reused postgresql; return 0; fi
  apt_install postgresql-15 postgresql-client-15
  local t0=$SECONDS
  mkdir -p "$dir"; chown postgres:postgres "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then  # missing or half-written: start over
    rm -rf "$dir/data"
    runuser -u postgres -- "$pg_bin/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log"
  fi
  refuse_foreign_port postgresql "$PG_PORT"
  # A postmaster.pid left by a killed server blocks start-up only when its PID is alive.
  local listen=${TASKHERD_SERVICES_BIND}
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -k $dir -c listen_addresses='$listen' -c max_connections=300 -c fsync=off" start >/dev/null
  wait_for postgresql 30 pg_ready || die "postgresql did not answer on :$PG_PORT (log: $dir/postgres.log)"
  local psql=("$pg_bin/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1)
  "${psql[@]}" -tAc "select 1 from pg_roles where rolname='$SERVICE_USER'" | grep -q 1 ||
    "${psql[@]}" -c "create role $SERVICE_USER login superuser password '$SERVICE_PASSWORD'"
  "${psql[@]}" -tAc "select 1 from pg_database where datname='taskherd'" | grep -q 1 ||
    "${psql[@]}" -c "create database taskherd owner $SERVICE_USER"
  # Pods reach the database over the cluster bridge: allow password logins from anywhere we listen.
  grep -q '^host all all 0.0.0.0/0 md5' "$dir/data/pg_hba.conf" || {
    echo 'host all all 0.0.0.0/0 md5' >>"$dir/data/pg_hba.conf"
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/data" reload >/dev/null
  }
  service_started postgresql "$t0" ":$PG_PORT"
}

# --- Alertmanager ------------------------------------------------------------------------------
alertmanager_ready() { curl -sf "http://127.0.0.1:$ALERTMANAGER_PORT/-/ready" >/dev/null; }
alertmanager_up() {
  local dir=$TASKHERD_SERVICES_DIR/alertmanager exe
  if pidfile_pid "$dir/pid" >/dev/null && alertmanager_ready; then service_reused alertmanager; return 0; fi
  apt_install prometheus-alertmanager curl
  local t0=$SECONDS
  mkdir -p "$dir/data"; rm -f "$dir/pid"
  refuse_foreign_port alertmanager "$ALERTMANAGER_PORT"
  # Alerts stay here: the only receiver is a no-op, tests read them back through the v2 API.
  cat >"$dir/alertmanager.yml" <<EOF
route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: "null"
EOF
  exe=$(readlink -f "$(command -v prometheus-alertmanager)")
  setsid "$exe" --config.file="$dir/alertmanager.yml" --storage.path="$dir/data" \
    --web.listen-address="0.0.0.0:$ALERTMANAGER_PORT" \
    --cluster.listen-address="127.0.0.1:$ALERTMANAGER_CLUSTER_PORT" \
    >"$dir/alertmanager.log" 2>&1 </dev/null &
  echo "$! $exe" >"$dir/pid"
  wait_for alertmanager 30 alertmanager_ready ||
    die "alertmanager did not answer on :$ALERTMANAGER_PORT (log: $dir/alertmanager.log)"
  service_started alertmanager "$t0" ":$ALERTMANAGER_PORT"
}

up() {
  mkdir -p "$TASKHERD_SERVICES_DIR"
  redis_up
  rabbitmq_up
  postgres_up
  alertmanager_up
}

down() {
  local pid
  stop_pidfile alertmanager "$TASKHERD_SERVICES_DIR/alertmanager/pid" 30
  if [ -f "$TASKHERD_SERVICES_DIR/postgres/data/postmaster.pid" ]; then
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$TASKHERD_SERVICES_DIR/postgres/data" -m fast stop >/dev/null 2>&1 || true
  fi
  if pid=$(pidfile_pid "$TASKHERD_SERVICES_DIR/rabbitmq/pid"); then
    if rabbitmqctl_ -q stop "$TASKHERD_SERVICES_DIR/rabbitmq/pid"; then
      log "stopped rabbitmq (pid $pid)"
    else
      stop_pidfile rabbitmq "$TASKHERD_SERVICES_DIR/rabbitmq/pid" 30
    fi
  fi
  stop_pidfile redis "$TASKHERD_SERVICES_DIR/redis/pid" 30
}

status() {
  if redis_ping; then echo "redis: up :$REDIS_PORT"; else echo "redis: down"; fi
  if rabbitmq_ready; then echo "rabbitmq: up :$RABBITMQ_PORT"; else echo "rabbitmq: down"; fi
  if pg_ready; then echo "postgresql: up :$PG_PORT"; else echo "postgresql: down"; fi
  if alertmanager_ready; then echo "alertmanager: up :$ALERTMANAGER_PORT"; else echo "alertmanager: down"; fi
}

# One `up` or `down` at a time per services directory: two at once (two clones' make runs, say)
# would each take the other's half-started RabbitMQ for a killed run's leftover and kill it.
# flock -o: the lock is held by flock itself, so the daemons `up` starts do not inherit (and keep) it.
locked() {
  local lock=$TASKHERD_SERVICES_DIR/services.lock rc=0
  mkdir -p "$TASKHERD_SERVICES_DIR"
  flock -n -E 75 -o "$lock" bash "${BASH_SOURCE[0]}" "$1-unlocked" || rc=$?
  if [ "$rc" = 75 ]; then
    log "waiting for another 'services.sh up/down' to finish ($lock)"
    rc=0
    flock -w 900 -E 75 -o "$lock" bash "${BASH_SOURCE[0]}" "$1-unlocked" || rc=$?
    [ "$rc" != 75 ] || die "another 'services.sh up/down' held $lock for 15 minutes"
  fi
  return "$rc"
}

export_env
case "${1:-}" in
  up) locked up ;;
  down) locked down ;;
  up-unlocked) up ;;
  down-unlocked) down ;;
  status) status ;;
  env) env | grep '^TASKHERD_' ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
