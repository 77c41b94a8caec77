#!/usr/bin/env bash
# Installs (Debian packages) and runs the services the tests need, on loopback, on ports of their
# own so they never meet a system-wide instance: Redis, RabbitMQ with the management plugin,
# PostgreSQL, Prometheus and Alertmanager.
#
#   scripts/services.sh up        start whatever is not already running (idempotent)
#   scripts/services.sh down      stop exactly what `up` started, by PID
#   scripts/services.sh status    one line per service
#   source scripts/services.sh env   export the connection URLs (TASKHERD_*_URL …)
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

log() { echo "[services] $*" >&2; }

# Installs the Debian packages that are missing; `apt-get update` only when something is.
ensure_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.5
  done
}

port_in_use() { ss -Hltn "sport = :$1" | grep -q .; }

refuse_foreign_port() {  # a port held by a process we did not start is a clear error, not a hang
  if port_in_use "$2"; then
    log "port $2 for $1 is in use by a process this script did not start:"
    ss -Hltnp "sport = :$2" >&2
    return 1
  fi
}

# --- Redis -------------------------------------------------------------------------------------
redis_up() {
  local dir=$TASKHERD_SERVICES_DIR/redis
  redis_ping && pid_alive "$dir/pid" && return 0
  ensure_packages redis-server redis-tools
  mkdir -p "$dir"; rm -f "$dir/pid"
  refuse_foreign_port redis "$REDIS_PORT"
  redis-server --port "$REDIS_PORT" --bind "${TASKHERD_SERVICES_BIND//,/ }" --protected-mode no \
    --daemonize yes --pidfile "$dir/pid" --dir "$dir" --logfile "$dir/redis.log" \
    --save "" --appendonly no
  wait_until 20 redis redis_ping && log "redis on :$REDIS_PORT"
}
redis_ping() { redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

# --- RabbitMQ ----------------------------------------------------------------------------------
rabbitmq_env() {
  local dir=$TASKHERD_SERVICES_DIR/rabbitmq
  export HOME=$dir  # the Erlang cookie lives in $HOME
  export RABBITMQ_NODENAME=taskherd@localhost
  export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
  export RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log
  export RABBITMQ_PID_FILE=$dir/pid RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
  export RABBITMQ_DIST_PORT ERL_EPMD_ADDRESS=127.0.0.1
}
rabbitmqctl_() { (rabbitmq_env; /usr/lib/rabbitmq/bin/rabbitmqctl "$@"); }
rabbitmq_ready() { rabbitmqctl_ -q status >/dev/null 2>&1 && curl -sf -u "$SERVICE_USER:$SERVICE_PASSWORD" "http://127.0.0.1:$RABBITMQ_MGMT_PORT/api/overview" >/dev/null; }
rabbitmq_up() {
  local dir=$TASKHERD_SERVICES_DIR/rabbitmq
  pid_alive "$dir/pid" && rabbitmq_ready && return 0
  ensure_packages rabbitmq-server curl
  if pid_alive "$dir/pid"; then  # alive but not answering: a half-started node from a killed run
    kill "$(cat "$dir/pid")"; sleep 2
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
  wait_until 90 "rabbitmq node" rabbitmqctl_ -q await_startup
  # The default guest account only works from loopback: pods need a real user.
  rabbitmqctl_ -q add_user "$SERVICE_USER" "$SERVICE_PASSWORD" 2>/dev/null || true
  rabbitmqctl_ -q set_user_tags "$SERVICE_USER" administrator
  rabbitmqctl_ -q set_permissions -p / "$SERVICE_USER" ".*" ".*" ".*"
  wait_until 60 "rabbitmq management API" rabbitmq_ready && log "rabbitmq on :$RABBITMQ_PORT (management :$RABBITMQ_MGMT_PORT)"
}

# --- PostgreSQL --------------------------------------------------------------------------------
pg_bin=/usr/lib/postgresql/15/bin
pg_ready() { "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }
postgres_up() {
  local dir=$TASKHERD_SERVICES_DIR/postgres
  pg_ready && [ -f "$dir/data/postmaster.pid" ] && return 0
  ensure_packages postgresql-15 postgresql-client-15
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
  wait_until 30 postgres pg_ready
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
  log "postgresql on :$PG_PORT"
}

# --- Prometheus and Alertmanager ---------------------------------------------------------------
alertmanager_up() {
  local dir=$TASKHERD_SERVICES_DIR/alertmanager
  pid_alive "$dir/pid" && curl -sf "http://127.0.0.1:$ALERTMANAGER_PORT/-/ready" >/dev/null && return 0
  ensure_packages prometheus-alertmanager curl
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
  setsid prometheus-alertmanager --config.file="$dir/alertmanager.yml" --storage.path="$dir/data" \
    --web.listen-address="0.0.0.0:$ALERTMANAGER_PORT" \
    --cluster.listen-address="127.0.0.1:$ALERTMANAGER_CLUSTER_PORT" \
    >"$dir/alertmanager.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  wait_until 30 alertmanager curl -sf "http://127.0.0.1:$ALERTMANAGER_PORT/-/ready" &&
    log "alertmanager on :$ALERTMANAGER_PORT"
}

up() {
  mkdir -p "$TASKHERD_SERVICES_DIR"
  redis_up && rabbitmq_up && postgres_up && alertmanager_up
}

stop_pid() {  # stop_pid NAME PIDFILE — only the process we recorded
  local name=$1 pidfile=$2
  if pid_alive "$pidfile"; then
    local pid; pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "stopped $name ($pid)"
  fi
  rm -f "$pidfile"
}

down() {
  stop_pid alertmanager "$TASKHERD_SERVICES_DIR/alertmanager/pid"
  if [ -f "$TASKHERD_SERVICES_DIR/postgres/data/postmaster.pid" ]; then
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$TASKHERD_SERVICES_DIR/postgres/data" -m fast stop >/dev/null 2>&1 || true
  fi
  if pid_alive "$TASKHERD_SERVICES_DIR/rabbitmq/pid"; then
    rabbitmqctl_ -q stop "$TASKHERD_SERVICES_DIR/rabbitmq/pid" || stop_pid rabbitmq "$TASKHERD_SERVICES_DIR/rabbitmq/pid"
  fi
  stop_pid redis "$TASKHERD_SERVICES_DIR/redis/pid"
}

status() {
  redis_ping && echo "redis: up :$REDIS_PORT" || echo "redis: down"
  rabbitmq_ready && echo "rabbitmq: up :$RABBITMQ_PORT" || echo "rabbitmq: down"
  pg_ready && echo "postgresql: up :$PG_PORT" || echo "postgresql: down"
  curl -sf "http://127.0.0.1:$ALERTMANAGER_PORT/-/ready" >/dev/null && echo "alertmanager: up :$ALERTMANAGER_PORT" || echo "alertmanager: down"
}

export_env
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) export_env; env | grep '^TASKHERD_' ;;
    *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
  esac
fi
